"""com.microsoft QAttention: Attention whose QKV projection is an 8-bit integer product.

What onnxruntime.quantization.quantize_dynamic makes of com.microsoft Attention (the
transformers optimizer's fused BERT attention). Inputs: input (8-bit, quantized on the fly
by a DynamicQuantizeLinear before it), weight (8-bit), bias (float), input_scale,
weight_scale (per tensor or per column), mask_index, input_zero_point, weight_zero_point,
past. The projection is ``((x - x_zp) @ (w - w_zp)) * (x_scale * w_scale) + bias`` in int32
then float32, as onnxruntime's; the attention after it is Attention's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument
from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_attention_contrib import packed_attention

from .qlinear import integer_matmul_to_float, packed_b, per_column, scalar


@kernel(
    "QAttention",
    since=1,
    domain="com.microsoft",
    dtypes={0: ("uint8", "int8"), 1: ("uint8", "int8"), 2: ("float",)},
)
def q_attention(node: Any, xp: Any):
    op = node.op_type
    attend = packed_attention(node, xp)
    packed = packed_b(node, 1, 7)

    def run(x, w, bias, x_scale, w_scale, mask=None, x_zp=None, w_zp=None, past=None):
        if x.ndim != 3 or w.ndim != 2 or x.shape[-1] != w.shape[0]:
            raise InvalidArgument(
                f"{op}: input must be (batch, sequence, hidden) and weight (hidden, 3 * hidden), "
                f"got {x.shape} and {w.shape}"
            )
        n = w.shape[1]
        mult = np.float32(scalar(x_scale, op, "input_scale")) * per_column(
            w_scale, n, op, "weight_scale"
        ).astype(np.float32)
        za = scalar(x_zp, op, "input_zero_point", 0)
        proj = integer_matmul_to_float(x, za, w, w_zp, mult, bias, op, packed)
        return attend(proj, np.dtype(np.float32), mask, past)

    return run
