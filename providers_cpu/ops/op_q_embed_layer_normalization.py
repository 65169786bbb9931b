"""com.microsoft QEmbedLayerNormalization: EmbedLayerNormalization on 8-bit tables.

What onnxruntime.quantization.quantize_dynamic makes of EmbedLayerNormalization: every
table, gamma and beta is dequantized with its per-tensor scale and zero point first.
Inputs: input_ids, segment_ids, word/position/segment embeddings, gamma, beta, mask, then
their five scales and five zero points; outputs: output, mask_index.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel

from ._embed import embed_layer_norm
from ._qlinear import dequantize, scalar


@kernel("QEmbedLayerNormalization", since=1, domain="com.microsoft", dtypes={0: ("int32",)})
def q_embed_layer_normalization(node: Any, xp: Any):
    op = node.op_type
    eps = float(node.attr("epsilon", 1e-12))
    names = ("word_embedding", "position_embedding", "segment_embedding", "gamma", "beta")

    def run(input_ids, segment_ids, word, position, segment, gamma, beta, mask, *params):
        params = list(params) + [None] * (10 - len(params))
        tables = []
        for j, (t, name) in enumerate(zip((word, position, segment, gamma, beta), names)):
            if t is None:
                tables.append(None)
                continue
            s = scalar(params[j], op, f"{name}_scale")
            z = scalar(params[5 + j], op, f"{name}_zero_point", 0)
            tables.append(dequantize(t, s, z))
        y, mask_index, _ = embed_layer_norm(
            op, eps, input_ids, segment_ids, *tables[:2], tables[2], tables[3], tables[4], mask
        )
        return (y, mask_index)

    return run
