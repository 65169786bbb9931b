"""Conv -> Relu or Clip as one com.microsoft FusedConv (activation applied to the Conv's output).

The activation then runs in place on the convolution's fresh output instead of as
a second full pass that allocates another tensor (what onnxruntime's Conv +
activation fusion emits, too). Exact for float32 and float64: the fused kernel
applies the same ufuncs to the same values the two nodes compute; float16 for Relu and
a Clip whose bounds are float16 values (``_dtype_refusal`` says why). Other narrow
floats are left alone (their Conv rounds before the activation would see the value).
Clip's bounds must be constants: FusedConv takes them as attributes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from . import rule_checks as C
from .pattern_pass import PatternFusionPass

MS = "com.microsoft"


class _ConvActivation(pattern.RewriteRuleClassBase):
    def __init__(self, name: str, act: str) -> None:
        super().__init__(name)
        self._act = act

    def pattern(self, op, x, w):
        conv = op.Conv(x, w, _allow_other_inputs=True, _outputs=["conv"])
        # Clip's optional min and max are read from the node: a pattern variable
        # does not match an omitted input.
        return getattr(op, self._act)(conv, _allow_other_inputs=True, _outputs=["act"])

    def check(self, context, x, w, conv, act, **_) -> pattern.MatchResult:
        bounds = _clip_bounds(act.producer()) if self._act == "Clip" else None
        reasons = [_dtype_refusal(x, self._act, bounds)]
        if self._act == "Clip":
            reasons.append(None if bounds is not None else "Clip's min or max is not a constant")
        return C.verdict(*reasons)

    def rewrite(self, op, x, w, conv, act, **_):
        node = conv.producer()
        attrs = {name: a.value for name, a in node.attributes.items()}
        params = [] if self._act == "Relu" else list(_clip_bounds(act.producer()))
        extra = {"activation_params": params} if params else {}
        return op.FusedConv(*node.inputs, _domain=MS, activation=self._act, **attrs, **extra)


def _dtype_refusal(x: ir.Value, act: str, bounds: tuple[float, float] | None) -> str | None:
    """Why the fused node would not equal the two, or None.

    float32 and float64 apply the same ufunc to the same values. float16 too, for Relu
    and for a Clip whose bounds are float16 values: rounding to float16 is monotone and
    keeps 0 and every float16 value, so clamping before or after the Conv's rounding
    gives the same float16 (the CUDA FusedConv clamps cuDNN's float32 accumulator).
    """
    if x.dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE):
        return None
    if x.dtype == ir.DataType.FLOAT16:
        if act == "Relu":
            return None
        if bounds is not None and all(float(np.float16(b)) == b for b in bounds):
            return None
        if bounds is not None:
            return f"float16 Clip bounds {bounds} are not float16 values"
    return f"dtype {C.dtype_name(x)}: the Conv rounds before the activation"


def _clip_bounds(clip: ir.Node) -> tuple[float, float] | None:
    """(min, max) of a Clip (attributes before opset 11, constant inputs after), else None."""
    if "min" in clip.attributes or "max" in clip.attributes or len(clip.inputs) <= 1:
        lo = clip.attributes.get("min")
        hi = clip.attributes.get("max")
        return (
            float("-inf") if lo is None else float(lo.value),
            float("inf") if hi is None else float(hi.value),
        )
    out = []
    for i, default in ((1, float("-inf")), (2, float("inf"))):
        v = clip.inputs[i] if i < len(clip.inputs) else None
        if v is None:
            out.append(default)
            continue
        s = C.scalar(v)
        if s is None:
            return None
        out.append(s)
    return out[0], out[1]


class FuseConvActivation(PatternFusionPass):
    """Conv -> Relu / Clip into com.microsoft FusedConv. Exact (see module)."""

    name = "fuse_conv_activation"
    exact = True

    def make_rules(self) -> Sequence[pattern.RewriteRule]:
        return [
            _ConvActivation.rule("conv_relu", act="Relu"),
            _ConvActivation.rule("conv_clip", act="Clip"),
        ]
