"""Attention written out in standard ops -> one onnxep::Attention (ONNX Attention-23's contract).

``MatMul(softmax(scale * q @ kᵀ + mask), v)`` as torch exports it: the
decomposed ``scaled_dot_product_attention`` (hf_llama*.onnx: a split sqrt
scale on q and kᵀ, a float mask Add, a ``Where(IsNaN(p), 0, p)`` guard) and
hand-written attention (llama_kv.onnx: a Div of the scores, a causal
``Where(mask, -inf, scores)``). The pattern covers what must disappear with
the fusion, from the score MatMul to the context MatMul:

- the scores scaled or not (Mul or Div by a constant scalar, either order);
- no mask, a float mask added (either order, any shape broadcastable to the
  scores), or a bool condition filling ``-inf`` through Where (either
  branch; it becomes the op's bool mask, True where a key takes part);
- Softmax over the last axis, or a float16/bfloat16 graph's Cast to float32,
  Softmax, Cast back;
- optionally torch's NaN guard on the probabilities.

What feeds the two MatMuls (the scale on q and kᵀ, K's transpose, GQA's
repeated K/V heads) is traced back in :mod:`.attention_inputs`, which says
why by hand. The repeat is folded into the op's head groups only for K and V
together (both must end with the same number of heads); the report counts
the fires that did as ``attention_gqa``, the others as ``attention``.

Tolerance-level, not exact: the kernel accumulates scores and context in
float32 and never rounds the scores, the scaled scores or the probabilities
to a float16 graph's type between the steps, and the scale is applied once
(the product of the constants) instead of in pieces. One difference is not
a rounding one: a row whose keys are all masked out gives zeros (what
torch's NaN guard gives), where an unguarded Softmax gives NaN.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from ..ops.fused import DOMAIN
from . import rule_checks as C
from .attention_inputs import Key, key_of, peel_scale, repeated_heads
from .pattern_pass import PatternFusionPass

_ALT = pattern.OrValue


def _scaled(op, x, scale):
    return _ALT(
        [op.Mul(x, scale), op.Mul(scale, x), op.Div(x, scale), x],
        tag_var="score_scaling",
        tag_values=["mul", "mul", "div", "none"],
    )


def _masked(op, x, mask, cond, fill):
    return _ALT(
        [
            op.Add(x, mask),
            op.Add(mask, x),
            op.Where(cond, fill, x),
            op.Where(cond, x, fill),
            x,
        ],
        tag_var="mask_form",
        tag_values=["add", "add", "fill_where_true", "fill_where_false", "none"],
    )


def _softmax(op, x):
    wide = op.Cast(
        op.Softmax(op.Cast(x, _outputs=["widened"]), _outputs=["probs32"]), _outputs=["narrowed"]
    )
    return _ALT([wide, op.Softmax(x, _outputs=["probs"])], tag_var="cast_softmax")


class _Plan:
    """What ``check`` proved, for ``rewrite`` to build (the rule keeps state between them)."""

    query: ir.Value
    key: Key
    value: ir.Value
    scale: float
    gqa: bool


class _Shared(threading.local):
    """What the thread's rule tells its pass (rules are compiled once per thread): the values
    the fused nodes stopped reading, where the sweep for dead glue starts, and whether the
    latest rewrite folded a head repeat."""

    def __init__(self) -> None:
        self.seeds: list[ir.Value] = []
        self.folded = False


_shared = _Shared()


class _Attention(pattern.RewriteRuleClassBase):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._plan = _Plan()

    def pattern(self, op, qq, kk, value, score_scale, mask, cond, fill):
        scores = _masked(op, _scaled(op, op.MatMul(qq, kk), score_scale), mask, cond, fill)
        probs = _softmax(op, scores)
        probs = _ALT([op.Where(op.IsNaN(probs), 0.0, probs), probs])
        return op.MatMul(probs, value)

    def check(
        self,
        context,
        qq,
        kk,
        value,
        score_scale=None,
        mask=None,
        cond=None,
        fill=None,
        score_scaling="none",
        mask_form="none",
        probs=None,
        probs32=None,
        widened=None,
        narrowed=None,
        **_,
    ) -> pattern.MatchResult:
        reason = C.floats(qq, kk, value) or _rank4(qq, kk, value)
        if reason:
            return C.verdict(reason)
        softmax = (probs or probs32).producer()
        scale = 1.0
        if score_scaling != "none":
            s = C.scalar(score_scale)
            if s is None or not np.isfinite(s) or s == 0:
                return C.verdict("the scores are scaled by something other than a constant scalar")
            scale = s if score_scaling == "mul" else 1.0 / s
        reason = (
            _mask_reason(mask_form, mask, cond, fill, qq)
            or (None if C.last_axis(softmax, softmax.inputs[0]) else NOT_LAST_AXIS)
            or (_casts_reason(widened, narrowed, qq) if probs32 is not None else None)
        )
        if reason:
            return C.verdict(reason)
        plan = self._plan
        plan.query, q_scale = peel_scale(qq)
        plan.key, plan.value = key_of(kk), value
        plan.scale = scale * q_scale * plan.key.scale
        if not np.isfinite(plan.scale) or plan.scale == 0:
            return C.verdict("the constant scales multiply to zero or overflow")
        plan.gqa = _fold_repeats(plan)
        return C.verdict(_heads_reason(plan))

    def rewrite(self, op, qq, kk, value, mask=None, cond=None, mask_form="none", **_):
        plan = self._plan
        key = plan.key.value
        if plan.key.perm is not None:
            key = op.Transpose(key, perm=plan.key.perm)
        inputs = [plan.query, key, plan.value]
        if mask_form == "add":
            inputs.append(mask)
        elif mask_form == "fill_where_true":
            inputs.append(op.Not(cond))  # Where(cond, -inf, s): True in cond hides the key
        elif mask_form == "fill_where_false":
            inputs.append(cond)
        _shared.seeds.extend([qq, kk, value])
        _shared.folded = plan.gqa
        return op.Attention(*inputs, scale=float(plan.scale), _domain=DOMAIN)


NOT_LAST_AXIS = "the Softmax is not over the last axis"


def _fold_repeats(plan: _Plan) -> bool:
    """Read K and V from before their heads were repeated, when both were, by one count.

    Otherwise (no repeat, or one not proved alike) the op reads the repeated K and V, as
    many heads as Q: still right, only not saving the repeat.
    """
    if plan.key.perm is not None:
        return False  # K comes from another layout through the transpose: no repeat of K
    k = repeated_heads(plan.key.value)
    v = repeated_heads(plan.value)
    if k is None or v is None or not _same(k[1], v[1]):
        return False
    heads = C.dim(k[0], 1)
    if heads is None or heads != C.dim(v[0], 1):
        return False
    plan.key = Key(k[0], None, plan.key.scale)
    plan.value = v[0]
    return True


def _same(a: Any, b: Any) -> bool:
    """Equal repeat counts: equal ints or symbolic dims, or one shape tensor."""
    if isinstance(a, ir.Value) or isinstance(b, ir.Value):
        return a is b
    return a == b


def _heads_reason(plan: _Plan) -> str | None:
    """Dims that are known and break Attention's layout (Q, K, V of one batch; K and V of the
    same heads, a whole number of them per query head); unknown dims the kernel checks."""
    q, v = plan.query, plan.value
    k_axes = (0, 2) if plan.key.perm == [0, 2, 1, 3] else (0, 1)  # K given as [B, S, H, D]
    batch = [C.dim(q, 0), C.dim(plan.key.value, k_axes[0]), C.dim(v, 0)]
    if len({b for b in batch if b is not None}) > 1:
        return "Q, K and V are not of one batch (the MatMuls broadcast it)"
    hq, hk, hv = C.dim(q, 1), C.dim(plan.key.value, k_axes[1]), C.dim(v, 1)
    if hk is not None and hv is not None and hk != hv:
        return "K and V have different numbers of heads"
    if isinstance(hq, int) and isinstance(hk, int) and (hk == 0 or hq % hk):
        return "Q's heads are not a whole number of groups of K's"
    return None


def _rank4(*values: ir.Value) -> str | None:
    if any(C.rank(v) != 4 for v in values):
        return "q, kᵀ and v are not all known to be 4-D"
    return None


def _mask_reason(form: str, mask: Any, cond: Any, fill: Any, like: ir.Value) -> str | None:
    if form == "add":
        if mask is None or mask.dtype != like.dtype:
            return "the added mask is not of the scores' dtype"
        r = C.rank(mask)
        if r is None or r > 4:
            return "the added mask is not known to be at most 4-D"
        return None
    if form.startswith("fill_"):
        if cond is None or cond.dtype != ir.DataType.BOOL:
            return "the Where's condition is not bool"
        f = C.scalar(fill)
        if f is None or not np.isneginf(f):
            return "the Where fills something other than a constant -inf"
        r = C.rank(cond)
        if r is None or r > 4:
            return "the Where's condition is not known to be at most 4-D"
    return None


def _casts_reason(widened: ir.Value, narrowed: ir.Value, like: ir.Value) -> str | None:
    to_up = widened.producer().attributes.get("to")
    to_down = narrowed.producer().attributes.get("to")
    if to_up is None or to_up.value != ir.DataType.FLOAT:
        return "the scores are cast to something other than float32 for the Softmax"
    if to_down is None or to_down.value != like.dtype:
        return "the probabilities are not cast back to the inputs' dtype"
    return None


class FuseAttention(PatternFusionPass):
    """Attention in standard ops -> onnxep::Attention. Tolerance-level (see module)."""

    name = "fuse_attention"
    exact = False

    def make_rules(self) -> Sequence[pattern.RewriteRule]:
        return [_Attention.rule("attention")]

    def fire(self, anchor: ir.Node, rule: str) -> None:
        # One rule; the report tells the fires that folded GQA's head repeat apart.
        super().fire(anchor, f"{rule}_gqa" if _shared.folded else rule)

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        _shared.seeds.clear()
        result = super().call(model)
        self._drop_dead_glue(_shared.seeds)
        _shared.seeds.clear()
        return result

    def _drop_dead_glue(self, seeds: list[ir.Value]) -> None:
        """Remove the glue the fused nodes bypassed (scales, transposes, repeats, the shape
        arithmetic feeding them) once nothing reads it; glue still read elsewhere stays."""
        stack = list(seeds)
        while stack:
            v = stack.pop()
            node = None if v is None else v.producer()
            if node is None or node.graph is None or not _dead(node) or not self.owns(node):
                continue
            stack.extend(node.inputs)
            node.graph.remove(node, safe=True)


def _dead(node: ir.Node) -> bool:
    if any(
        a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
        for a in node.attributes.values()
    ):
        return False
    return not any(v.uses() or v.is_graph_output() for v in node.outputs)
