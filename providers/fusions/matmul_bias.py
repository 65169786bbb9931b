"""MatMul followed by a bias Add -> onnxep::MatMulBias(a, b, bias): one GEMM, bias in its epilogue.

Matches ``Add(MatMul(a, b), bias)`` (either operand order of the Add) where
``b`` is a matrix and ``bias`` a vector over the output's last axis, all of
one float type. A residual Add (a full tensor, not a vector) is refused with
that reason. Runs after ``fuse_bias_gelu``, so a bias feeding a GELU goes to
the GELU kernel instead.

Tolerance-level: the GEMM adds the bias in its float32 accumulator and rounds
once, where MatMul then Add round twice, and cuBLAS may pick another
algorithm for a GEMM with an addend. (The generic kernel, the CPU reference,
is the MatMul and the Add.)
"""

from __future__ import annotations

from collections.abc import Sequence

from onnxscript.rewriter import pattern

from ..ops.fused import DOMAIN
from . import rule_checks as C
from .pattern_pass import PatternFusionPass


class _MatMulBias(pattern.RewriteRuleClassBase):
    def pattern(self, op, a, b, bias):
        return op.Add(op.MatMul(a, b), bias)

    def check(self, context, a, b, bias, **_) -> pattern.MatchResult:
        return C.verdict(
            C.floats(a, b, bias),
            None if C.rank(b) == 2 else "the right operand is not a matrix",
            None if (C.rank(a) or 0) >= 2 else "the left operand is not a matrix or batch of them",
            C.vector_over_last_axis(bias, b, "addend"),
        )

    def rewrite(self, op, a, b, bias, **_):
        return op.MatMulBias(a, b, bias, _domain=DOMAIN)


class FuseMatMulBias(PatternFusionPass):
    """MatMul + bias Add -> onnxep::MatMulBias. Tolerance-level (see module)."""

    name = "fuse_matmul_bias"
    exact = False

    def make_rules(self) -> Sequence[pattern.RewriteRule]:
        return list(pattern.RewriteRuleSet([_MatMulBias.rule("matmul_bias")], commute=True).rules)
