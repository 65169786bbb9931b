"""com.microsoft EmbedLayerNormalization: word + position (+ segment) embeddings, then LayerNorm.

What onnxruntime.transformers.optimizer fuses a BERT embedding block into. Inputs:
input_ids, segment_ids, word_embedding, position_embedding, segment_embedding, gamma,
beta, mask, position_ids; outputs: output, mask_index, embedding_sum.
"""

from __future__ import annotations

from typing import Any

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel

from ._embed import embed_layer_norm


@kernel(
    "EmbedLayerNormalization",
    since=1,
    domain="com.microsoft",
    dtypes={0: ("int32",), 2: ("float",)},
)
def embed_layer_normalization(node: Any, xp: Any):
    eps = float(node.attr("epsilon", 1e-12))
    if int(node.attr("mask_index_type", 1)) not in (0, 1):
        raise NotSupported("EmbedLayerNormalization: mask_index_type must be 0 or 1")

    def run(
        input_ids,
        segment_ids,
        word,
        position,
        segment=None,
        gamma=None,
        beta=None,
        mask=None,
        position_ids=None,
    ):
        y, mask_index, total = embed_layer_norm(
            node.op_type,
            eps,
            input_ids,
            segment_ids,
            word,
            position,
            segment,
            gamma,
            beta,
            mask,
            position_ids,
        )
        return (y, mask_index, total)

    return run
