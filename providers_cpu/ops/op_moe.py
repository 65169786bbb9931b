"""com.microsoft MoE: each token through the top-k of its experts' FFNs, mixed by router weight.

Routing: softmax of the token's ``router_probs`` row, its ``k`` largest (ties to the lower
expert), their probabilities as mixing weights, renormalized to sum 1 with
``normalize_routing_weights``. An expert is ``FC2(act(FC1(x)))`` with weights [N, K] per
expert (x @ W^T + b); ``swiglu`` takes gate and linear halves from FC1 interleaved
(``swiglu_fusion=1``), concatenated (2), or from FC1 and FC3 (0). 2-D (packed tokens) and
3-D inputs are both rows of tokens.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel

from ._moe import MoeSpec, check_experts, linear, mixture


@kernel("MoE", since=1, domain="com.microsoft", dtypes={0: ("float", "float16", "bfloat16")})
def moe(node: Any, xp: Any):
    spec = MoeSpec(node)

    def run(x, probs, w1, b1=None, w2=None, b2=None, w3=None, b3=None):
        experts = probs.shape[-1]
        for what, t in (("fc1_experts_weights", w1), ("fc2_experts_weights", w2)):
            check_experts(spec.op, what, t, experts)

        def expert(e, rows):
            h = linear(rows, w1[e], None if b1 is None else b1[e])
            up = None
            if spec.act == "swiglu" and not spec.fused:
                up = linear(rows, w3[e], None if b3 is None else b3[e]) if w3 is not None else None
            return linear(spec.activate(h, up), w2[e], None if b2 is None else b2[e])

        return (mixture(spec, x, probs, expert),)

    return run
