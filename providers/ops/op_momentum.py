"""Momentum (ai.onnx.preview.training): standard or Nesterov momentum SGD."""

from __future__ import annotations

from typing import Any

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo


@kernel("Momentum", since=1, domain="ai.onnx.preview.training")
def momentum(node: NodeInfo, xp: Any):
    norm = float(node.attr("norm_coefficient"))
    alpha = float(node.attr("alpha"))
    beta = float(node.attr("beta"))
    mode = node.attr("mode")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in ("standard", "nesterov"):
        raise NotSupported(f"Momentum: mode {mode!r} is neither 'standard' nor 'nesterov'")
    nesterov = mode == "nesterov"
    n = (node.num_inputs - 2) // 3

    def run(r, t, *rest):
        xs, gs, vs = rest[:n], rest[n : 2 * n], rest[2 * n : 3 * n]
        out_x, out_v = [], []
        for x, g, v in zip(xs, gs, vs, strict=True):
            dt = x.dtype
            rr = r.astype(dt).reshape(())
            # The gradient's coefficient is 1 on the first step (T == 0).
            b = xp.where(t.reshape(()) > 0, beta, 1.0).astype(dt)
            gr = norm * x + g
            v2 = alpha * v + b * gr
            x2 = x - rr * (gr + alpha * v2) if nesterov else x - rr * v2
            out_x.append(x2.astype(dt))
            out_v.append(v2.astype(v.dtype))
        return tuple(out_x + out_v)

    return run
