"""Adagrad (ai.onnx.preview.training): one update of several tensors."""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo


@kernel("Adagrad", since=1, domain="ai.onnx.preview.training")
def adagrad(node: NodeInfo, xp: Any):
    norm = float(node.attr("norm_coefficient", 0.0))
    eps = float(node.attr("epsilon", 1e-6))
    decay = float(node.attr("decay_factor", 0.0))
    n = (node.num_inputs - 2) // 3

    def run(r, t, *rest):
        xs, gs, hs = rest[:n], rest[n : 2 * n], rest[2 * n : 3 * n]
        new_x, new_h = [], []
        for x, g, h in zip(xs, gs, hs, strict=True):
            dt = x.dtype
            lr = (r.astype(dt) / (1 + t.astype(dt) * decay)).reshape(())
            gr = norm * x + g
            h2 = h + gr * gr
            new_x.append((x - lr * gr / (xp.sqrt(h2) + eps)).astype(dt))
            new_h.append(h2.astype(h.dtype))
        return tuple(new_x + new_h)

    return run
