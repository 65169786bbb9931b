"""Launch geometry of the GroupQueryAttention kernels (``gqa_cuda.py``).

Derived from shapes and the device's SM count only, never from a model's
sizes; every block stays within the 48 KiB of shared memory a kernel gets
without an opt-in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from onnxep.errors import InvalidArgument

#: Threads per prefill block (4 warps).
BLOCK = 128
#: Shared memory one block may use without an opt-in (bytes).
SMEM_LIMIT = 48 * 1024
#: Largest head size the kernels take (every tile below fits 48 KiB up to it).
MAX_HEAD_SIZE = 256
#: Query heads (one warp each) one decode block serves; more heads per KV head make row groups.
#: 8 warps: gqa_decode's __launch_bounds__(256), under which it needs no register spills.
DECODE_MAX_ROWS = 8
#: Keys a decode block stages at once: one per lane, fewer where 48 KiB is short.
_KEY_TILES = (32, 16, 8)
#: Decode blocks per SM a long context is split into.
DECODE_BLOCKS_PER_SM = 2

_FLOATS_PER_BLOCK = SMEM_LIMIT // 4


@dataclass(frozen=True)
class DecodeGeometry:
    """Launch shape of gqa_decode."""

    rows: int  # query heads per block, a warp each
    nrg: int  # row groups per KV head
    nsplit: int  # blocks per (KV head, row group, batch): the most splits a row may use
    ktile: int  # keys staged in shared memory at once
    smem: int  # dynamic shared memory, bytes

    @property
    def threads(self) -> int:
        return 32 * self.rows


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
    """Whether a step of ``s`` new query tokens takes the fused decode kernel (else prefill)."""
    return s == 1


def plan_decode(b: int, nh: int, nkv: int, d: int, context: int, sms: int) -> DecodeGeometry:
    """Up to DECODE_BLOCKS_PER_SM blocks per SM for ``context`` keys (total_sequence_length),
    never more splits than key tiles. How many a batch row uses is decided on the device
    from the keys it attends (:func:`decode_splits`): a short context is one split whose
    block writes the output, a long one fills the device."""
    _check_head_size(d)
    g = nh // nkv
    nrg = math.ceil(g / DECODE_MAX_ROWS)
    rows = math.ceil(g / nrg)
    for ktile in _KEY_TILES:
        floats = rows * d + ktile * (d + 1) + ktile * d + rows * ktile
        if floats <= _FLOATS_PER_BLOCK:
            break
    else:
        raise InvalidArgument(f"GroupQueryAttention: head size {d} leaves no key tile in 48 KiB")
    want = max(1, math.ceil(DECODE_BLOCKS_PER_SM * sms / max(1, b * nkv * nrg)))
    nsplit = max(1, min(want, math.ceil(context / ktile)))
    return DecodeGeometry(rows, nrg, nsplit, ktile, 4 * floats)


def decode_splits(geo: DecodeGeometry, kv_end: int) -> tuple[int, int]:
    """(keys per split, splits) gqa_decode uses for a batch row attending ``kv_end`` keys:
    the device's ``split_chunk`` arithmetic."""
    per = math.ceil(kv_end / geo.nsplit)
    chunk = max(geo.ktile, _round_up(per, geo.ktile))
    return chunk, max(1, math.ceil(kv_end / chunk))


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
