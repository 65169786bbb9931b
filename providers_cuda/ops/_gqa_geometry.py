"""Launch geometry of the GroupQueryAttention kernels (``_gqa_cuda.py``).

Derived from shapes and the device's SM count only, never from a model's
sizes; every block stays within the 48 KiB of shared memory a kernel gets
without an opt-in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from onnxep.errors import InvalidArgument

#: Threads per attention block (4 warps).
BLOCK = 128
#: Shared memory one block may use without an opt-in (bytes).
SMEM_LIMIT = 48 * 1024
#: Largest head size the kernels take (every tile below fits 48 KiB up to it).
MAX_HEAD_SIZE = 256
#: Query rows per step up to which the split-K decode kernel runs.
DECODE_MAX_QUERY = 4
#: Query rows (query heads of one KV head x new tokens) one decode block holds.
DECODE_MAX_ROWS = 16

_FLOATS_PER_BLOCK = SMEM_LIMIT // 4


@dataclass(frozen=True)
class DecodeGeometry:
    """Launch shape of gqa_decode (and gqa_reduce when ``nchunks > 1``)."""

    rows: int  # query rows per block
    nrg: int  # row groups per KV head
    chunk: int  # keys per block
    nchunks: int
    ktile: int  # keys staged in shared memory at once
    smem: int  # dynamic shared memory, bytes


@dataclass(frozen=True)
class PrefillGeometry:
    bq: int  # query rows per block
    bk: int  # keys per shared-memory tile
    smem: int


def _check_head_size(d: int) -> None:
    if d < 1 or d > MAX_HEAD_SIZE:
        raise InvalidArgument(
            f"GroupQueryAttention: head size {d} is outside the CUDA kernel's range "
            f"1..{MAX_HEAD_SIZE}"
        )


def uses_decode(s: int) -> bool:
    """Whether ``s`` new query tokens take the split-K decode kernel (else the prefill one)."""
    return s <= DECODE_MAX_QUERY


def plan_decode(b: int, s: int, nh: int, nkv: int, d: int, cap: int, sms: int) -> DecodeGeometry:
    """Chunks over the cache capacity so that about two blocks per SM run, each chunk a
    multiple of 32 keys, every block within the 48 KiB of shared memory."""
    _check_head_size(d)
    nrows = (nh // nkv) * s
    nrg = math.ceil(nrows / DECODE_MAX_ROWS)
    rows = math.ceil(nrows / nrg)
    ktile = min(64, max(16, (8192 // (d + 1)) // 16 * 16))
    fixed = rows * d + ktile * (d + 1) + 2 * rows
    chunk_cap = (_FLOATS_PER_BLOCK - fixed) // rows // 32 * 32
    if chunk_cap < 32:
        raise InvalidArgument(f"GroupQueryAttention: head size {d} leaves no key chunk in 48 KiB")
    want = max(1, math.ceil(2 * sms / max(1, b * nkv * nrg)))
    chunk = max(32, _round_up(math.ceil(max(cap, 1) / want), 32))
    chunk = min(chunk, chunk_cap, max(32, _round_up(cap, 32)))
    nchunks = max(1, math.ceil(cap / chunk))
    ktile = min(ktile, chunk)
    smem = 4 * (rows * d + ktile * (d + 1) + 2 * rows + rows * chunk)
    return DecodeGeometry(rows, nrg, chunk, nchunks, ktile, smem)


_PREFILL_TILES = ((32, 32), (16, 32), (16, 16), (8, 16), (8, 8))


def plan_prefill(d: int) -> PrefillGeometry:
    """The largest (query, key) tile whose buffers fit in 48 KiB for head size ``d``."""
    _check_head_size(d)
    for bq, bk in _PREFILL_TILES:
        floats = bq * d + bk * (d + 1) + bk * d + bq * bk + bq * d + 3 * bq
        if floats <= _FLOATS_PER_BLOCK:
            return PrefillGeometry(bq, bk, 4 * floats)
    raise InvalidArgument(f"GroupQueryAttention: head size {d} leaves no tile in 48 KiB")


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m
