"""GELU written out in primitives -> com.microsoft Gelu (erf form) or FastGelu (tanh form).

``0.5 * x * (1 + erf(x / sqrt 2))`` and ``0.5 * x * (1 + tanh(sqrt(2/pi) *
(x + 0.044715 x^3)))``, as PyTorch exports ``F.gelu`` below opset 20.
onnxscript's rules (``erfgelu``, ``gelu``) match both, in every order of
their commutative operands, but compare constants at float32 precision, so a
float16 graph (0.5, 1.4140625, 0.79785156) never matches them; ours take the
same structures with each constant checked at its own dtype's precision, and
the erf form scaled by ``Mul(x, 1/sqrt 2)`` too. ``fuse_bias_gelu`` then takes
a bias Add before them.

Tolerance-level: the fused kernels compute in float32 (float64 for double)
and round once, where the primitives round after each of five to nine ops.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from onnxscript.rewriter import pattern
from onnxscript.rewriter.ort_fusions import erfgelu, gelu

from . import rule_checks as C
from .pattern_pass import PatternFusionPass


class _ErfGelu(pattern.RewriteRuleClassBase):
    """x * (0.5 * (erf(x / sqrt 2) + 1)), or 0.5 * (x * (...)); erf's input x * (1/sqrt 2) too."""

    def __init__(self, name: str, div: bool, half_outside: bool) -> None:
        super().__init__(name)
        self._div, self._outside = div, half_outside

    def pattern(self, op, x, scale, one, half):
        inner = op.Div(x, scale) if self._div else op.Mul(x, scale)
        e1 = op.Add(op.Erf(inner), one)
        return op.Mul(half, op.Mul(x, e1)) if self._outside else op.Mul(x, op.Mul(half, e1))

    def check(self, context, x, scale, one, half, **_) -> pattern.MatchResult:
        root2 = math.sqrt(2.0)
        return C.verdict(
            C.floats(x),
            C.near(scale, root2 if self._div else 1 / root2, x),
            C.near(one, 1.0, x),
            C.near(half, 0.5, x),
        )

    def rewrite(self, op, x, **_):
        return op.Gelu(x, _domain="com.microsoft")


class _TanhGelu(pattern.RewriteRuleClassBase):
    """x * (0.5 * (tanh(sqrt(2/pi) * (x + 0.044715 * x^3)) + 1)), or 0.5 * (x * (...))."""

    def __init__(self, name: str, half_outside: bool) -> None:
        super().__init__(name)
        self._outside = half_outside

    def pattern(self, op, x, three, k, c, one, half):
        inner = op.Add(x, op.Mul(k, op.Pow(x, three)))
        t1 = op.Add(op.Tanh(op.Mul(c, inner)), one)
        return op.Mul(half, op.Mul(x, t1)) if self._outside else op.Mul(x, op.Mul(half, t1))

    def check(self, context, x, three, k, c, one, half, **_) -> pattern.MatchResult:
        return C.verdict(
            C.floats(x),
            None if C.scalar(three) == 3.0 else "the exponent is not the constant 3",
            C.near(k, 0.044715, x),
            C.near(c, math.sqrt(2.0 / math.pi), x),
            C.near(one, 1.0, x),
            C.near(half, 0.5, x),
        )

    def rewrite(self, op, x, **_):
        return op.FastGelu(x, _domain="com.microsoft")


class FuseGelu(PatternFusionPass):
    """Erf and tanh GELU from primitives -> Gelu / FastGelu. Tolerance-level (see module)."""

    name = "fuse_gelu"
    exact = False

    def make_rules(self) -> Sequence[pattern.RewriteRule]:
        rules = [
            pattern.RewriteRule(erfgelu.erf_gelu_pattern_1, erfgelu.gelu, name="erf_gelu_1"),
            pattern.RewriteRule(erfgelu.erf_gelu_pattern_2, erfgelu.gelu, name="erf_gelu_2"),
            gelu.GeluErfFusion.rule(),
            gelu.GeluTanhFusion.rule(),
        ]
        ours = [
            *(
                _ErfGelu.rule(f"erf_gelu_{d}_{h}", div=d == "div", half_outside=h == "outer")
                for d in ("div", "mul")
                for h in ("inner", "outer")
            ),
            *(
                _TanhGelu.rule(f"tanh_gelu_{h}", half_outside=h == "outer")
                for h in ("inner", "outer")
            ),
        ]
        return list(pattern.RewriteRuleSet([*rules, *ours], commute=True).rules)
