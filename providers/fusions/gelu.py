"""GELU written out in primitives -> com.microsoft Gelu (erf form) or FastGelu (tanh form).

``0.5 * x * (1 + erf(x / sqrt 2))`` and ``0.5 * x * (1 + tanh(sqrt(2/pi) *
(x + 0.044715 x^3)))``, as PyTorch exports ``F.gelu`` below opset 20.
onnxscript's rules (``erfgelu``, ``gelu``) match both, in every order of
their commutative operands; ``fuse_bias_gelu`` then takes a bias Add before
them.

Tolerance-level: the fused kernels compute in float32 (float64 for double)
and round once, where the primitives round after each of five to nine ops.
"""

from __future__ import annotations

from collections.abc import Sequence

from onnxscript.rewriter import pattern
from onnxscript.rewriter.ort_fusions import erfgelu, gelu

from .pattern_pass import PatternFusionPass


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
        return list(pattern.RewriteRuleSet(rules, commute=True).rules)
