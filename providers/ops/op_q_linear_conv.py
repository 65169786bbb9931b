"""QLinearConv: quantized convolution requantized to the output's scale and zero point."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .quant import conv_nd, conv_params, saturate_cast


def _per_channel(p: Any, rank: int) -> Any:
    # Length-M parameters run along the output-channel axis.
    if p.ndim == 1 and p.shape[0] != 1:
        return p.reshape((-1,) + (1,) * (rank - 1))
    return p.reshape(())


@kernel("QLinearConv", since=10)
def q_linear_conv(node: NodeInfo, xp: Any):
    return build_q_linear_conv(node, xp)


def build_q_linear_conv(node: NodeInfo, xp: Any, integer_conv: Any = None):
    """The QLinearConv runner; ``integer_conv(x, x_zp, w, w_zp)``, when given, computes the
    int32 convolution (the CPU provider's exact one on float BLAS) in place of the im2col
    product in int32 here."""
    p = conv_params(node, node.inputs[3].shape if node.inputs[3] else None, None)
    out_dt = np.dtype(node.input_dtype(7) or np.uint8)

    def run(x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, bias=None):
        if integer_conv is not None:
            acc = integer_conv(x, x_zp, w, w_zp)
        else:
            xi = x.astype(np.int32) - x_zp.astype(np.int32).reshape(())
            wi = w.astype(np.int32) - _per_channel(w_zp.astype(np.int32), w.ndim)
            acc = conv_nd(xi, wi, p, xp)
        if bias is not None:
            acc = acc + bias.astype(np.int32).reshape((1, -1) + (1,) * (acc.ndim - 2))
        ws = w_scale.astype(np.float32)
        # Output-channel scales sit on axis 1 of the (N, M, ...) result.
        ws = (
            ws.reshape((1, -1) + (1,) * (acc.ndim - 2))
            if ws.ndim == 1 and ws.shape[0] != 1
            else ws.reshape(())
        )
        mult = x_scale.astype(np.float32).reshape(()) * ws / y_scale.astype(np.float32).reshape(())
        v = xp.round(acc.astype(np.float32) * mult) + y_zp.astype(np.float32).reshape(())
        return (saturate_cast(v, out_dt, xp),)

    return run
