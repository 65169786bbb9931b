"""SiLU(gate) * up -> onnxep::SwiGLU(gate, up).

The gated MLP of LLaMA-style decoders: ``down(silu(gate(h)) * up(h))``. Rules
take the SiLU ``fuse_silu`` emits and, with that pass switched off, the
primitive ``gate * Sigmoid(gate)``. ``fuse_shared_input_matmuls`` later folds
the gate and up projections into one MatMul whose output this node reads
packed (one input, gate then up along the last axis).

Exact: the fused kernel rounds the sigmoid, then the SiLU, then the product
to the storage type, as the unfused nodes do; byte-identical on the same
provider.
"""

from __future__ import annotations

from collections.abc import Sequence

from onnxscript.rewriter import pattern

from ..ops.fused import DOMAIN
from . import rule_checks as C
from .pattern_pass import PatternFusionPass


class _SwiGLU(pattern.RewriteRuleClassBase):
    def __init__(self, name: str, primitive: bool) -> None:
        super().__init__(name)
        self._primitive = primitive

    def pattern(self, op, gate, up):
        silu = op.Mul(gate, op.Sigmoid(gate)) if self._primitive else op.SiLU(gate, _domain=DOMAIN)
        return op.Mul(silu, up)

    def check(self, context, gate, up, **_) -> pattern.MatchResult:
        return C.verdict(C.floats(gate, up))

    def rewrite(self, op, gate, up, **_):
        return op.SwiGLU(gate, up, _domain=DOMAIN)


class FuseSwiGLU(PatternFusionPass):
    """silu(gate) * up -> onnxep::SwiGLU. Exact (see module)."""

    name = "fuse_swiglu"
    exact = True

    def make_rules(self) -> Sequence[pattern.RewriteRule]:
        rules = [
            _SwiGLU.rule("swiglu", primitive=False),
            _SwiGLU.rule("swiglu_sigmoid", primitive=True),
        ]
        return list(pattern.RewriteRuleSet(rules, commute=True).rules)
