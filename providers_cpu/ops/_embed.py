"""Shared math for com.microsoft EmbedLayerNormalization and QEmbedLayerNormalization."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument


def _gather(table: np.ndarray, ids: np.ndarray, op: str, what: str) -> np.ndarray:
    ids = ids.astype(np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
        bad = ids[(ids < 0) | (ids >= table.shape[0])].ravel()[0]
        raise InvalidArgument(f"{op}: {what} {bad} is out of range [0, {table.shape[0]})")
    return table[ids]


def embed_layer_norm(
    op: str,
    eps: float,
    input_ids: np.ndarray,
    segment_ids: Any,
    word: np.ndarray,
    position: np.ndarray,
    segment: Any,
    gamma: np.ndarray,
    beta: Any,
    mask: Any,
    position_ids: Any = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(layer-normed sum, mask_index, the sum) of the word, position and segment embeddings.

    Position ids default to 0..S-1 for every batch row; mask_index is the number of ones
    in each row of the mask (0 without a mask).
    """
    if input_ids.ndim != 2:
        raise InvalidArgument(
            f"{op}: input_ids must be 2-D (batch, sequence), got {input_ids.shape}"
        )
    b, s = input_ids.shape
    for name, t in (("segment_ids", segment_ids), ("mask", mask)):
        if t is not None and t.shape != input_ids.shape:
            raise InvalidArgument(f"{op}: {name} has shape {t.shape}, input_ids {input_ids.shape}")
    if position_ids is None:
        position_ids = np.broadcast_to(np.arange(s), (b, s))
    elif position_ids.shape not in ((b, s), (1, s)):
        raise InvalidArgument(
            f"{op}: position_ids must be ({b}, {s}) or (1, {s}), got {position_ids.shape}"
        )
    x = _gather(word, input_ids, op, "input id").astype(np.float32)
    x = x + _gather(position, np.broadcast_to(position_ids, (b, s)), op, "position id")
    if segment is not None and segment_ids is not None:
        x = x + _gather(segment, segment_ids, op, "segment id")
    mean = x.mean(axis=-1, keepdims=True)
    c = x - mean
    var = (c * c).mean(axis=-1, keepdims=True)
    y = c / np.sqrt(var + np.float32(eps)) * gamma.astype(np.float32)
    if beta is not None:
        y = y + beta.astype(np.float32)
    if mask is None:
        mask_index = np.zeros((b,), np.int32)
    else:
        mask_index = mask.astype(np.int64).sum(axis=1).astype(np.int32)
    return y.astype(np.float32), mask_index, x.astype(np.float32)
