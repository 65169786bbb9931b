"""The per-head L2 norm of q and of k -> inside onnxep::GatedLinearAttention.

Qwen3.5-style layers normalise each head of q and k before the recurrence,
as exports write it: ``Reshape (B, T, H*d) -> (B, T, H, d)``,
``LpNormalization(p=2, last axis)``, ``Reshape`` back, and for q a ``Mul``
by a constant (``1/sqrt(d)``). Each rule folds one such chain feeding
``GatedLinearAttention`` (what ``fuse_linear_attention_gates`` made) into the
node's ``q_l2_norm`` / ``k_l2_norm`` attributes, and q's constant into
``q_scale``; the CUDA kernel normalises each head while staging a token,
which reads q and k once per head anyway. The manager's rounds apply the q
and the k rule one after the other.

The chain must normalise exactly the attention's heads: the normalised axis
has the head size ``d_k`` (query width / ``q_num_heads``), the first Reshape
splits only the last axis and the second restores the input's shape, all
known statically. Only ``LpNormalization`` is taken: its zero norm gives 0,
where the hand-written ``x / max(norm, eps)`` torch exports differs for tiny
norms, so that chain would need an ``eps`` of its own.

Tolerance-level. On the CPU the fused node runs LpNormalization's and Mul's
own kernels (byte-identical there); the CUDA kernel sums squares in its own
order (rounded to the storage type after the norm and after the scale, as
the unfused nodes round).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir
from onnxscript.rewriter import pattern

from ..ops.fused import DOMAIN
from . import rule_checks as C
from .linear_attention_gates import attrs_of
from .pattern_pass import PatternFusionPass


def _attr(node: ir.Node, name: str, default):
    a = node.attributes.get(name)
    return default if a is None else a.value


def _ints(v: ir.Value | None) -> list[int] | None:
    arr = C.const(v)
    return None if arr is None else [int(t) for t in arr.reshape(-1)]


def width_of(v: ir.Value | None) -> int | None:
    """The last dim of ``v``: static, or read through a scaling Mul or a constant Reshape."""
    if v is None:
        return None
    w = C.dim(v, -1)
    if isinstance(w, int):
        return w
    p = v.producer()
    if p is not None and p.op_type == "Mul" and p.domain in ("", "ai.onnx"):
        for x in p.inputs:
            if C.scalar(x) is None:
                return width_of(x)
    if p is not None and p.op_type == "Reshape" and p.domain in ("", "ai.onnx"):
        shape = _ints(p.inputs[1] if len(p.inputs) > 1 else None)
        if shape and shape[-1] > 0:
            return shape[-1]
    if p is not None and p.op_type == "Split" and p.domain in ("", "ai.onnx"):
        sizes = _ints(p.inputs[1] if len(p.inputs) > 1 else None) or _attr(p, "split", None)
        if sizes and C.last_axis(p, p.inputs[0], default=0) and len(sizes) == len(p.outputs):
            return int(sizes[v.index()])
    return None


def _keeps_leading(shape: list[int], x: ir.Value) -> bool:
    """A Reshape shape whose first two entries keep x's batch and sequence dims."""
    return all(s == 0 or s == C.dim(x, i) for i, s in enumerate(shape[:2]))


def heads_of(node: ir.Node, x: ir.Value, flat: ir.Node, back: ir.Node, what: str) -> str | None:
    """Why ``Reshape(flat) -> LpNormalization -> Reshape(back)`` of ``x`` is not a per-head norm
    of the attention's heads (None when it is): the first Reshape must split only x's last axis
    into (heads, d) with d the attention's head size, the second join them back."""
    split = _ints(flat.inputs[1] if len(flat.inputs) > 1 else None)
    join = _ints(back.inputs[1] if len(back.inputs) > 1 else None)
    if split is None or join is None:
        return f"the {what} norm's Reshape shapes are not constant"
    if any(_attr(n, "allowzero", 0) for n in (flat, back)):
        return f"the {what} norm's Reshapes set allowzero"
    if C.rank(x) not in (None, 3) or len(split) != 4 or len(join) != 3:
        return f"the {what} norm does not split (batch, seq, hidden) into heads"
    if not (_keeps_leading(split, x) and _keeps_leading(join, x)):
        return f"the {what} norm's Reshapes change more than the last axis"
    heads, d = split[2], split[3]
    width = join[2] if join[2] > 0 else C.dim(x, -1)
    if d <= 0 or not isinstance(width, int) or width != (heads if heads > 0 else width // d) * d:
        return f"the {what} norm's head size is not known statically"
    qwidth, hq = width_of(node.inputs[0]), _attr(node, "q_num_heads", 0)
    if qwidth is None or hq <= 0:
        return "the query width is not known statically"
    if d * hq != qwidth:
        return f"the {what} norm is over {d} values, not the head size {qwidth // hq}"
    return None


class _L2Norm(pattern.RewriteRuleClassBase):
    def __init__(self, name: str, which: str, scaled: bool, outputs: int) -> None:
        super().__init__(name)
        self._which, self._scaled, self._outputs = which, scaled, outputs

    def pattern(self, op, x, split, join, scale):
        heads = op.Reshape(x, split, _allow_other_attributes=True, _outputs=["lp_in"])
        normed = op.LpNormalization(heads, _allow_other_attributes=True, _outputs=["lp_out"])
        back = op.Reshape(normed, join, _allow_other_attributes=True, _outputs=["back"])
        val = op.Mul(back, scale) if self._scaled else back
        names = ["y", "present"][: self._outputs]
        # The node's other inputs are read from it in rewrite(): a pattern variable does not
        # match an omitted input (the past state, b).
        first = (val,) if self._which == "q" else (pattern.ANY_VALUE, val)
        return op.GatedLinearAttention(
            *first, _domain=DOMAIN, _allow_other_inputs=True, _outputs=names
        )

    def check(self, context, x, lp_in, lp_out, back, y, scale=None, **_) -> pattern.MatchResult:
        node, lp = y.producer(), lp_out.producer()
        flag = f"{self._which}_l2_norm"
        return C.verdict(
            None if not _attr(node, flag, 0) else f"{flag} is already set",
            None
            if self._which == "k" or _attr(node, "q_scale", 1.0) == 1.0
            else "q_scale is already set",
            C.floats(x, back),
            None if _attr(lp, "p", 2) == 2 else "the norm is not L2 (p != 2)",
            None if C.last_axis(lp, lp_in) else "the norm is not over the last axis",
            heads_of(node, x, lp_in.producer(), back.producer(), self._which),
            None if not self._scaled or _scalar_like(scale, x) else "q's scale is not a constant",
        )

    def rewrite(self, op, x, y, **kw):
        node = y.producer()
        attrs = attrs_of(node)
        attrs[f"{self._which}_l2_norm"] = 1
        if self._scaled:
            attrs["q_scale"] = C.scalar(kw["scale"])
        inputs = list(node.inputs)
        inputs[0 if self._which == "q" else 1] = x
        return op.GatedLinearAttention(*inputs, _domain=DOMAIN, _outputs=self._outputs, **attrs)


def _scalar_like(v: ir.Value | None, like: ir.Value) -> bool:
    return C.scalar(v) is not None and v.dtype == like.dtype


class FuseLinearAttentionL2Norm(PatternFusionPass):
    """Per-head L2 norm of q / k (and q's scale) -> onnxep::GatedLinearAttention's attributes.
    Tolerance-level (see module)."""

    name = "fuse_linear_attention_l2_norm"
    exact = False

    def make_rules(self) -> Sequence[pattern.RewriteRule]:
        variants = [("q", True), ("q", False), ("k", False)]
        rules = [
            _L2Norm.rule(
                f"{which}_l2_norm{'_scaled' if scaled else ''}_{outputs}out",
                which=which,
                scaled=scaled,
                outputs=outputs,
            )
            for which, scaled in variants
            for outputs in (2, 1)
        ]
        return list(pattern.RewriteRuleSet(rules, commute=True).rules)
