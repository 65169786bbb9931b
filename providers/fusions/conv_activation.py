"""Conv -> activation as one FusedConv (the activation applied to the Conv's output).

The activation then runs on the convolution's fresh output instead of as a second
full pass that allocates another tensor (what onnxruntime's Conv + activation fusion
emits, too). Every provider gets Relu and Clip (com.microsoft FusedConv); a provider
whose FusedConv kernels run more (the CPU's, ``providers_cpu/ops/conv_epilogue.py``)
asks for them by name (``FuseConvActivation(extra=...)``):

- ``HardSigmoid``, ``LeakyRelu``: com.microsoft FusedConv's own activations;
- ``HardSwish`` (Conv -> HardSwish), ``SiLU`` (Conv -> Sigmoid and Mul(conv, sigmoid))
  and ``ClipSwish`` (Conv -> Add(conv, a) -> Clip(lo, hi) -> Mul(conv, clip) -> Div(d),
  PaddlePaddle's HardSwish) and ``Gelu`` (Conv -> Div(conv, d) -> Erf -> Add(a) ->
  Mul(conv, .) -> Mul(h), float32 only: the fused kernel runs the CPU Erf's float32
  approximation): onnxruntime's FusedConv has no such activation, so these
  become ``onnxep::FusedConv`` (the same inputs and attributes), which only a provider
  with a kernel for it is given (the pass emits only ops its provider has kernels for,
  and runs on that provider's nodes only).

Exact for float32 and float64: the fused kernel applies the unfused nodes' float
operations to the same values, in their order; float16 for Relu and a Clip whose
bounds are float16 values (``_dtype_refusal`` says why), the rest only for float32 and
float64 (the Conv rounds to float16 before the activation would see the value). Clip's
bounds and the constants of ClipSwish must be constants that a float attribute holds
exactly: FusedConv takes them as ``activation_params``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from . import rule_checks as C
from .pattern_pass import PatternFusionPass

MS = "com.microsoft"


#: The activations beyond Relu and Clip a provider may ask for, and the op each becomes.
EXTRA = ("HardSigmoid", "LeakyRelu", "HardSwish", "SiLU", "ClipSwish", "Gelu")
_ONNXEP_ONLY = ("HardSwish", "SiLU", "ClipSwish", "Gelu")
_ATTR_DEFAULTS = {"HardSigmoid": (("alpha", 0.2), ("beta", 0.5)), "LeakyRelu": (("alpha", 0.01),)}


def _fused(op, node: ir.Node, act: str, params: Sequence[float]):
    attrs = {name: a.value for name, a in node.attributes.items()}
    extra = {"activation_params": [float(p) for p in params]} if params else {}
    domain = "onnxep" if act in _ONNXEP_ONLY else MS
    return op.FusedConv(*node.inputs, _domain=domain, activation=act, **attrs, **extra)


def _float_attr_refusal(params: Sequence[float]) -> str | None:
    """A constant a float32 attribute would round (a float64 model's 0.1), or None."""
    for p in params:
        if float(np.float32(p)) != p and not np.isnan(p):
            return f"constant {p!r} is not exact as a float attribute"
    return None


def _exact_floats(x: ir.Value) -> str | None:
    if x.dtype in (ir.DataType.FLOAT, ir.DataType.DOUBLE):
        return None
    return f"dtype {C.dtype_name(x)}: the Conv rounds before the activation"


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
        params = [] if self._act == "Relu" else list(_clip_bounds(act.producer()))
        return _fused(op, conv.producer(), self._act, params)


class _ConvUnary(pattern.RewriteRuleClassBase):
    """Conv -> HardSigmoid / LeakyRelu / HardSwish (one node reading the Conv's output)."""

    def __init__(self, name: str, act: str) -> None:
        super().__init__(name)
        self._act = act

    def pattern(self, op, x, w):
        conv = op.Conv(x, w, _allow_other_inputs=True, _outputs=["conv"])
        return getattr(op, self._act)(conv, _outputs=["act"])

    def _params(self, act: ir.Node) -> list[float]:
        out = []
        for name, default in _ATTR_DEFAULTS.get(self._act, ()):
            a = act.attributes.get(name)
            out.append(float(default if a is None else a.value))
        return out

    def check(self, context, x, w, conv, act, **_) -> pattern.MatchResult:
        return C.verdict(_exact_floats(x))

    def rewrite(self, op, x, w, conv, act, **_):
        return _fused(op, conv.producer(), self._act, self._params(act.producer()))


class _ConvSiLU(pattern.RewriteRuleClassBase):
    """Conv -> Sigmoid, Mul(conv, sigmoid): onnxep::FusedConv SiLU."""

    def pattern(self, op, x, w):
        conv = op.Conv(x, w, _allow_other_inputs=True, _outputs=["conv"])
        return op.Mul(conv, op.Sigmoid(conv))

    def check(self, context, x, w, conv, **_) -> pattern.MatchResult:
        return C.verdict(_exact_floats(x))

    def rewrite(self, op, x, w, conv, **_):
        return _fused(op, conv.producer(), "SiLU", [])


class _ConvClipSwish(pattern.RewriteRuleClassBase):
    """Conv -> Add(conv, a) -> Clip(lo, hi) -> Mul(conv, clip) -> Div(d): ClipSwish."""

    def pattern(self, op, x, w, a, d):
        conv = op.Conv(x, w, _allow_other_inputs=True, _outputs=["conv"])
        clip = op.Clip(op.Add(conv, a), _allow_other_inputs=True, _outputs=["clip"])
        return op.Div(op.Mul(conv, clip), d)

    def _params(self, a, clip, d) -> list[float] | None:
        bounds = _clip_bounds(clip.producer())
        sa, sd = C.scalar(a), C.scalar(d)
        if bounds is None or sa is None or sd is None:
            return None
        return [sa, bounds[0], bounds[1], sd]

    def check(self, context, x, w, conv, a, d, clip, **_) -> pattern.MatchResult:
        params = self._params(a, clip, d)
        if params is None:
            return C.verdict("the Add or Div constant or Clip's bounds are not scalar constants")
        # a constant of higher rank would broadcast the Conv's output to it
        ranks = [C.rank(v) for v in (a, d)]
        out_rank = C.rank(conv)
        wide = out_rank is None or any(r is None or r > out_rank for r in ranks)
        return C.verdict(
            _exact_floats(x),
            C.floats(x, a, d),
            "a constant's rank may exceed the Conv output's" if wide else None,
            _float_attr_refusal(params),
        )

    def rewrite(self, op, x, w, conv, a, d, clip, **_):
        return _fused(op, conv.producer(), "ClipSwish", self._params(a, clip, d))


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


class _ConvAddRelu(pattern.RewriteRuleClassBase):
    """Conv -> Add(conv, z) -> Relu: com.microsoft FusedConv (X, W, B, Z) with Relu, as
    onnxruntime's Conv + Add + Relu fusion emits (a residual block's last conv)."""

    def pattern(self, op, x, w, z):
        conv = op.Conv(x, w, _allow_other_inputs=True, _outputs=["conv"])
        return op.Relu(op.Add(conv, z))

    def check(self, context, x, w, conv, z, **_) -> pattern.MatchResult:
        node = conv.producer()
        return C.verdict(
            _exact_floats(x),
            C.floats(x, z),
            # Z is added in place to the Conv's output: it must be that shape, not broadcast
            C.same_shape(conv, z),
            "the Conv already has a fourth input" if len(node.inputs) > 3 else None,
        )

    def rewrite(self, op, x, w, conv, z, **_):
        node = conv.producer()
        attrs = {name: a.value for name, a in node.attributes.items()}
        b = node.inputs[2] if len(node.inputs) > 2 else None
        return op.FusedConv(x, w, b, z, _domain=MS, activation="Relu", **attrs)


class _ConvGelu(pattern.RewriteRuleClassBase):
    """Conv -> Div(conv, d) -> Erf -> Add(a) -> Mul(conv, .) -> Mul(h): Gelu (d, a, h)."""

    def pattern(self, op, x, w, d, a, h):
        conv = op.Conv(x, w, _allow_other_inputs=True, _outputs=["conv"])
        e1 = op.Add(op.Erf(op.Div(conv, d)), a)
        return op.Mul(op.Mul(conv, e1), h)

    def check(self, context, x, w, conv, d, a, h, **_) -> pattern.MatchResult:
        params = [C.scalar(v) for v in (d, a, h)]
        if any(p is None for p in params):
            return C.verdict("the Div, Add or Mul constant is not a scalar constant")
        ranks = [C.rank(v) for v in (d, a, h)]
        out_rank = C.rank(conv)
        wide = out_rank is None or any(r is None or r > out_rank for r in ranks)
        f32 = x.dtype == ir.DataType.FLOAT
        return C.verdict(
            None if f32 else f"dtype {C.dtype_name(x)}: the fused Erf is the float32 one",
            C.floats(x, d, a, h),
            "a constant's rank may exceed the Conv output's" if wide else None,
            _float_attr_refusal(params),
        )

    def rewrite(self, op, x, w, conv, d, a, h, **_):
        params = [C.scalar(v) for v in (d, a, h)]
        return _fused(op, conv.producer(), "Gelu", params)


class FuseConvActivation(PatternFusionPass):
    """Conv -> Relu / Clip (and, when asked, the ``EXTRA`` activations) into FusedConv.

    Exact (see module). ``extra`` names the activations of ``EXTRA`` the bound
    provider's FusedConv kernels run; the default is none (Relu and Clip only).
    ``residual``: Conv -> Add(conv, z) -> Relu too, as FusedConv with Z (the same shape
    as the Conv's output: added in place, then Relu; the unfused nodes' bits).
    """

    name = "fuse_conv_activation"
    exact = True

    def __init__(self, extra: Sequence[str] = (), residual: bool = False) -> None:
        unknown = sorted(set(extra) - set(EXTRA))
        if unknown:
            raise ValueError(f"FuseConvActivation: unknown activations {unknown}; known: {EXTRA}")
        self._extra = tuple(sorted(set(extra)))
        # Conv -> Add(conv, z) -> Relu into FusedConv with Z, for a provider whose FusedConv
        # adds Z (the CPU's)
        self._residual = residual
        self.rules_key = (*self._extra, residual)
        super().__init__()

    def make_rules(self) -> Sequence[pattern.RewriteRule]:
        rules = [
            # The longer chains first: their Conv output has other consumers a shorter
            # rule would refuse for.
            *(
                pattern.RewriteRuleSet([_ConvClipSwish.rule("conv_clip_swish")], commute=True).rules
                if "ClipSwish" in self._extra
                else []
            ),
            *(
                pattern.RewriteRuleSet([_ConvGelu.rule("conv_gelu")], commute=True).rules
                if "Gelu" in self._extra
                else []
            ),
            *(
                pattern.RewriteRuleSet([_ConvSiLU.rule("conv_silu")], commute=True).rules
                if "SiLU" in self._extra
                else []
            ),
            *(
                pattern.RewriteRuleSet([_ConvAddRelu.rule("conv_add_relu")], commute=True).rules
                if self._residual
                else []
            ),
            _ConvActivation.rule("conv_relu", act="Relu"),
            _ConvActivation.rule("conv_clip", act="Clip"),
        ]
        for act in ("HardSigmoid", "LeakyRelu", "HardSwish"):
            if act in self._extra:
                rules.append(_ConvUnary.rule(f"conv_{_snake(act)}", act=act))
        return rules


def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name).lstrip("_")
