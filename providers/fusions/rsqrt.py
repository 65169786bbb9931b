"""Reciprocal(Sqrt(x)) (or Div(1, Sqrt(x))) -> onnxep::Rsqrt(x).

Exact: the fused kernel rounds the square root to x's type and then takes
the reciprocal, as the two nodes do, so its output is byte-identical to
theirs on the same provider. ``fuse_rms_norm`` runs first, so the pair left
for this pass is one no norm took (or one in a norm that was refused).
"""

from __future__ import annotations

from collections.abc import Sequence

from onnxscript.rewriter import pattern

from ..ops.fused import DOMAIN
from . import rule_checks as C
from .pattern_pass import PatternFusionPass


class _Rsqrt(pattern.RewriteRuleClassBase):
    def __init__(self, name: str, div: bool) -> None:
        super().__init__(name)
        self._div = div

    def pattern(self, op, x, one):
        root = op.Sqrt(x)
        return op.Div(one, root) if self._div else op.Reciprocal(root)

    def check(self, context, x, one, **_) -> pattern.MatchResult:
        return C.verdict(C.floats(x), _unit(one, x) if self._div else None)

    def rewrite(self, op, x, **_):
        return op.Rsqrt(x, _domain=DOMAIN)


def _unit(one, x) -> str | None:
    """``one`` is a constant 1 of x's type that does not broadcast the result to more dims."""
    if C.scalar(one) != 1.0 or one.dtype != x.dtype:
        return "the numerator is not the constant 1 of x's type"
    r, rx = C.rank(one), C.rank(x)
    if r is None or rx is None or r > rx:
        return "the constant 1 could broadcast the result to more dims"
    return None


class FuseRsqrt(PatternFusionPass):
    """1 / sqrt(x) -> onnxep::Rsqrt. Exact (see module)."""

    name = "fuse_rsqrt"
    exact = True

    def make_rules(self) -> Sequence[pattern.RewriteRule]:
        return [_Rsqrt.rule("rsqrt_reciprocal", div=False), _Rsqrt.rule("rsqrt_div", div=True)]
