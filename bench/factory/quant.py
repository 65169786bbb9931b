"""Block-wise weight quantization for ``MatMulNBits``, as onnxruntime's quantizer does it.

The builder quantizes with MLAS's round-to-nearest block quantizer (through
``onnxruntime.quantization.MatMulNBitsQuantizer``). This is the same
arithmetic in NumPy, so the factory needs no onnxruntime and produces the same
bytes: per output column, blocks of ``block_size`` along K; symmetric blocks
use zero point ``2**(bits-1)`` and a scale that maps the largest-magnitude
value to the lowest code; asymmetric blocks span ``[min(v, 0), max(v, 0)]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class NBitsWeight:
    packed: np.ndarray  # uint8 [N, K/block, block*bits/8]
    scales: np.ndarray  # float32 [N, K/block]
    zero_points: np.ndarray | None  # uint8 [N, ceil(K/block * bits / 8)], None if symmetric


def quantize_nbits(
    weight: np.ndarray, bits: int = 4, block_size: int = 32, symmetric: bool = True
) -> NBitsWeight:
    """Quantize a [K, N] MatMul weight block-wise along K."""
    if bits not in (4, 8):
        raise ValueError(f"MatMulNBits weights here are 4 or 8 bits, not {bits}")
    k, n = weight.shape
    blocks = -(-k // block_size)
    w = np.zeros((blocks * block_size, n), np.float32)
    w[:k] = weight
    w = w.T.reshape(n, blocks, block_size)  # one row of blocks per output column
    top = (1 << bits) - 1
    if symmetric:
        mid = 1 << (bits - 1)
        idx = np.abs(w).argmax(axis=-1)[..., None]
        extreme = np.take_along_axis(w, idx, axis=-1)[..., 0]
        scales = (extreme / np.float32(-mid)).astype(np.float32)
        zp = np.full(scales.shape, mid, np.float32)
    else:
        lo = np.minimum(w.min(axis=-1), 0).astype(np.float32)
        hi = np.maximum(w.max(axis=-1), 0).astype(np.float32)
        scales = ((hi - lo) / np.float32(top)).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            zp_f = np.where(scales != 0, -lo / scales, lo)
        zp = np.clip(np.round(zp_f), 0, top).astype(np.float32)
    with np.errstate(divide="ignore"):
        recip = np.where(scales != 0, np.float32(1) / scales, 0).astype(np.float32)
    # C's roundf (ties away from zero) of v / scale + zero point, as MLAS computes it
    x = w * recip[..., None] + zp[..., None]
    q = np.clip(np.trunc(x + np.copysign(np.float32(0.5), x)), 0, top).astype(np.uint8)
    if bits == 4:
        q = (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)
    zero_points = None
    if not symmetric:
        zq = zp.astype(np.uint8)
        if bits == 4:
            if zq.shape[1] % 2:
                # MLAS pads the odd block's partner nibble with the middle code
                zq = np.concatenate([zq, np.full((n, 1), 8, np.uint8)], axis=1)
            zq = (zq[:, 0::2] | (zq[:, 1::2] << 4)).astype(np.uint8)
        zero_points = zq
    return NBitsWeight(q, scales, zero_points)


def dequantize_nbits(
    packed: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    k: int,
    bits: int,
    block_size: int,
) -> np.ndarray:
    """The [K, N] float32 weight a MatMulNBits node multiplies by."""
    n, blocks = packed.shape[0], packed.shape[1]
    if bits == 4:
        q = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(n, blocks, block_size)
    else:
        q = packed.reshape(n, blocks, block_size)
    if zero_points is None:
        zp = np.full((n, blocks), 1 << (bits - 1), np.float32)
    elif bits == 4:
        zp = np.stack([zero_points & 0x0F, zero_points >> 4], axis=-1).reshape(n, -1)[:, :blocks]
    else:
        zp = zero_points.reshape(n, -1)[:, :blocks]
    s = scales.reshape(n, blocks).astype(np.float32)
    w = (q.astype(np.float32) - zp[..., None].astype(np.float32)) * s[..., None]
    return w.reshape(n, blocks * block_size)[:, :k].T
