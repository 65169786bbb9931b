"""Adam (ai.onnx.preview.training): one update of several tensors."""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo


@kernel("Adam", since=1, domain="ai.onnx.preview.training")
def adam(node: NodeInfo, xp: Any):
    norm = float(node.attr("norm_coefficient", 0.0))
    norm_post = float(node.attr("norm_coefficient_post", 0.0))
    alpha = float(node.attr("alpha", 0.9))
    beta = float(node.attr("beta", 0.999))
    eps = float(node.attr("epsilon", 1e-6))
    n = (node.num_inputs - 2) // 4

    def run(r, t, *rest):
        xs, gs = rest[:n], rest[n : 2 * n]
        vs, hs = rest[2 * n : 3 * n], rest[3 * n : 4 * n]
        out_x, out_v, out_h = [], [], []
        for x, g, v, h in zip(xs, gs, vs, hs, strict=True):
            dt = x.dtype
            tf = t.astype(dt).reshape(())
            rr = r.astype(dt).reshape(())
            gr = norm * x + g
            v2 = alpha * v + (1 - alpha) * gr
            h2 = beta * h + (1 - beta) * (gr * gr)
            # Bias correction applies from the first counted step on (T > 0).
            corrected = rr * xp.sqrt(1 - beta**tf) / (1 - alpha**tf)
            lr = xp.where(tf > 0, corrected, rr)
            x2 = (1 - norm_post) * (x - lr * (v2 / (xp.sqrt(h2) + eps)))
            out_x.append(x2.astype(dt))
            out_v.append(v2.astype(v.dtype))
            out_h.append(h2.astype(h.dtype))
        return tuple(out_x + out_v + out_h)

    return run
