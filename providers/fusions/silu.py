"""x * Sigmoid(x) -> onnxep::SiLU(x).

Exact: the fused kernel rounds the sigmoid to x's type and multiplies, as the
two nodes do, so its output is byte-identical to theirs on the same provider.
"""

from __future__ import annotations

from collections.abc import Sequence

from onnxscript.rewriter import pattern

from ..ops.fused import DOMAIN
from . import rule_checks as C
from .pattern_pass import PatternFusionPass


class _SiLU(pattern.RewriteRuleClassBase):
    def pattern(self, op, x):
        return op.Mul(x, op.Sigmoid(x))

    def check(self, context, x, **_) -> pattern.MatchResult:
        return C.verdict(C.floats(x))

    def rewrite(self, op, x, **_):
        return op.SiLU(x, _domain=DOMAIN)


class FuseSiLU(PatternFusionPass):
    """x * sigmoid(x) -> onnxep::SiLU. Exact (see module)."""

    name = "fuse_silu"
    exact = True

    def make_rules(self) -> Sequence[pattern.RewriteRule]:
        return list(pattern.RewriteRuleSet([_SiLU.rule("silu")], commute=True).rules)
