"""The gates feeding LinearAttention -> onnxep::GatedLinearAttention (gates computed inside).

A gated-delta layer (Qwen3.5-style hybrid decoders) computes, per token and KV head,
``decay = decay_scale * softplus(a + dt_bias)`` (log-space: LinearAttention
takes ``exp(decay)`` itself) and ``beta = sigmoid(b)``, then runs the
recurrence. Rules, for com.microsoft ``LinearAttention`` with update rule
``gated`` (decay only) or ``gated_delta`` (decay and beta), with one or two
outputs:

- ``gate``: a com.microsoft ``LinearAttentionGate(a, dt_bias, decay_scale, b)``
  whose outputs feed only that LinearAttention;
- ``primitives``: the chains it replaces, ``Mul(Softplus(Add(a, dt_bias)),
  decay_scale)`` for the decay and ``Sigmoid(b)`` for beta, with ``dt_bias``
  and ``decay_scale`` holding one value per last-axis position of ``a``
  (statically known shapes), as LinearAttentionGate requires.

The fused node takes ``(query, key, value, past_state, a, dt_bias,
decay_scale, b)`` and LinearAttention's attributes; its CUDA kernel computes
each token's gates while staging it. ONNX's LinearAttention (opset 27) is
left alone: its CPU kernel runs in another precision for float64 and its
present state takes past's type, so it would need its own fused op.

Tolerance-level. On the CPU the fused node runs the gate's own arithmetic and
the same LinearAttention kernel, so the ``gate`` form is byte-identical
there; the ``primitives`` form computes the gates in float32 where the
primitives round after each op, and the CUDA kernel evaluates softplus and
sigmoid with the device's functions (both rounded to a's type as the gate
node does).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir
from onnxscript.rewriter import pattern

from ..ops.fused import DOMAIN
from . import rule_checks as C
from .pattern_pass import PatternFusionPass

MS = "com.microsoft"


def la_rule(node: ir.Node) -> str:
    a = node.attributes.get("update_rule")
    rule = "gated_delta" if a is None else a.value
    return rule.decode() if isinstance(rule, bytes) else str(rule)


def attrs_of(node: ir.Node) -> dict:
    """The node's attributes as keyword arguments for a replacement node."""
    return {k: a.value for k, a in node.attributes.items()}


def per_last_axis(v: ir.Value, of: ir.Value, what: str) -> str | None:
    """``v`` holds one value per last-axis position of ``of``: statically (1, ..., 1, h)."""
    shape = C.const_shape(v)
    if shape is None and v.shape is not None and all(isinstance(d, int) for d in v.shape):
        shape = tuple(int(d) for d in v.shape)
    h = C.dim(of, -1)
    if shape is None or not isinstance(h, int):
        return f"the {what}'s shape or a's last dim is not known statically"
    if not shape or any(d != 1 for d in shape[:-1]) or shape[-1] != h:
        return f"the {what} has shape {shape}, not one value per last-axis position of a ({h})"
    return None


class _Gates(pattern.RewriteRuleClassBase):
    def __init__(self, name: str, primitive: bool, delta: bool, outputs: int) -> None:
        super().__init__(name)
        self._primitive, self._delta, self._outputs = primitive, delta, outputs

    def pattern(self, op, a, dt_bias, decay_scale, b):
        if self._primitive:
            decay = op.Mul(op.Softplus(op.Add(a, dt_bias)), decay_scale)
            beta = op.Sigmoid(b) if self._delta else None
        elif self._delta:
            decay, beta = op.LinearAttentionGate(a, dt_bias, decay_scale, b, _domain=MS, _outputs=2)
        else:  # b, and a beta output, may be there or not: LinearAttention will not read them
            decay = op.LinearAttentionGate(
                a, dt_bias, decay_scale, _domain=MS, _allow_other_inputs=True
            )
            beta = None
        names = ["y", "present"][: self._outputs]
        # query, key, value and the optional past state are read from the node in rewrite():
        # a pattern variable does not match an omitted input.
        q = k = v = past = pattern.ANY_VALUE
        if self._delta:
            return op.LinearAttention(q, k, v, past, decay, beta, _domain=MS, _outputs=names)
        return op.LinearAttention(
            q, k, v, past, decay, _domain=MS, _allow_other_inputs=True, _outputs=names
        )

    def check(self, context, a, dt_bias, decay_scale, y, b=None, **_) -> pattern.MatchResult:
        la = y.producer()
        rule = la_rule(la)
        want = "gated_delta" if self._delta else "gated"
        reasons = [None if rule == want else f"update_rule is {rule}, this rule takes {want}"]
        if self._primitive:
            operands = (a, dt_bias, decay_scale, b) if self._delta else (a, dt_bias, decay_scale)
            reasons += [
                C.floats(*operands),
                per_last_axis(dt_bias, a, "dt_bias"),
                per_last_axis(decay_scale, a, "decay scale"),
            ]
        return C.verdict(*reasons)

    def rewrite(self, op, a, dt_bias, decay_scale, y, b=None, **_):
        la = y.producer()
        return op.GatedLinearAttention(
            *la.inputs[:4],
            a,
            dt_bias,
            decay_scale,
            b if self._delta else None,
            _domain=DOMAIN,
            _outputs=self._outputs,
            **attrs_of(la),
        )


class FuseLinearAttentionGates(PatternFusionPass):
    """LinearAttentionGate (or its primitives) + LinearAttention -> onnxep::GatedLinearAttention.
    Tolerance-level (see module)."""

    name = "fuse_linear_attention_gates"
    exact = False

    def make_rules(self) -> Sequence[pattern.RewriteRule]:
        rules = [
            _Gates.rule(
                f"{'primitive' if primitive else 'gate'}_{'gated_delta' if delta else 'gated'}"
                f"_{outputs}out",
                primitive=primitive,
                delta=delta,
                outputs=outputs,
            )
            for primitive in (False, True)
            for delta in (True, False)
            for outputs in (2, 1)
        ]
        return list(pattern.RewriteRuleSet(rules, commute=True).rules)
