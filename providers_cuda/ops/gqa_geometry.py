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


#: Tensor-core decode blocks per SM the capacity is split into (2 x 4 warps; their registers,
#: 150 to 250 a thread, allow 2 or 3).
TC_BLOCKS_PER_SM = 2
#: The head sizes, dtypes and compute capability the tensor-core decode takes (its V share per
#: lane is whole 16-byte loads; mma.m16n8k16 with fp16 operands is sm_80's).
TC_HEAD_SIZES = (64, 128, 256)
TC_MIN_CAPABILITY = 80
#: Query heads one tensor-core block serves (an mma's M), and its warps x 16-key tiles.
TC_MAX_ROWS = 16
TC_WARPS = 4
TC_SPLIT_KEYS = TC_WARPS * 16
#: Threads of the merge's one block a row: 16 to 32 groups of D/4 threads at head size 64 or
#: 128, so a row's 125 to 250 splits are read in one batch of loads a thread.
TC_MERGE_THREADS = 512


@dataclass(frozen=True)
class DecodeRoute:
    """Which decode kernel a step takes, and why (the kernel keeps it: ``run.routes``)."""

    kernel: str  # "tensor-core" or "cuda-core"
    reason: str

    def describe(self) -> str:
        return f"decode on {self.kernel}s: {self.reason}"


@dataclass(frozen=True)
class TcDecodeGeometry:
    """Launch shape of gqa_decode_tc and gqa_decode_merge."""

    rows: int  # query heads per block (at most TC_MAX_ROWS)
    nrg: int  # row groups per KV head
    tile_rows: int  # the kernel's ROWS: 8 (one mma's upper half) or 16
    nsplit: int  # blocks per (KV head, row group, batch): the most splits a row may use
    smem: int  # gqa_decode_tc's dynamic shared memory, bytes
    merge_smem: int  # gqa_decode_merge's

    threads = 32 * TC_WARPS
    merge_threads = TC_MERGE_THREADS


def tc_rows(group: int) -> tuple[int, int, int]:
    """(rows, row groups, ROWS) for ``group`` query heads per KV head."""
    nrg = math.ceil(group / TC_MAX_ROWS)
    rows = math.ceil(group / nrg)
    return rows, nrg, 8 if rows <= 8 else 16


def route_decode(
    dtype_name: str, d: int, group: int, capability: int, dv: int | None = None
) -> DecodeRoute:
    """The kernel a single-token step takes, from the dtype, head size (V's ``dv`` when it
    differs), heads per KV head and the device's compute capability (major * 10 + minor)."""
    why = None
    if dv is not None and dv != d:
        why = f"V's head size {dv} differs from Q and K's {d}"
    elif dtype_name != "float16":
        why = f"{dtype_name} keeps the products in float32 (the tensor-core path rounds P to fp16)"
    elif d not in TC_HEAD_SIZES:
        why = f"head size {d} is not one of {TC_HEAD_SIZES}"
    elif capability < TC_MIN_CAPABILITY:
        why = f"compute capability {capability / 10:.1f} has no fp16 mma.m16n8k16 (needs 8.0)"
    elif d == 256 and tc_rows(group)[2] == 16:
        why = (
            f"{group} query heads per KV head at head size 256 need more registers than a lane has"
        )
    if why is not None:
        return DecodeRoute("cuda-core", why)
    return DecodeRoute(
        "tensor-core",
        f"float16, head size {d}, {group} query heads per KV head, compute capability "
        f"{capability / 10:.1f}: split-K over the capacity on mma.m16n8k16",
    )


def plan_decode_tc(b: int, nh: int, nkv: int, d: int, capacity: int, sms: int) -> TcDecodeGeometry:
    """TC_BLOCKS_PER_SM blocks per SM over ``capacity`` keys (the most a row may attend, so one
    graph serves every length), never more splits than 64-key pieces of it. How many a row
    uses is decided on the device from the keys it attends (:func:`tc_splits`)."""
    _check_head_size(d)
    rows, nrg, tile_rows = tc_rows(nh // nkv)
    want = max(1, math.ceil(TC_BLOCKS_PER_SM * sms / max(1, b * nkv * nrg)))
    nsplit = max(1, min(want, math.ceil(capacity / TC_SPLIT_KEYS)))
    # staged Q (fp16), the warps' maxes and sums, two warps' output fragments, the new K and
    # V rows (fp16)
    floats = (
        tile_rows * d // 2 + 2 * TC_WARPS * tile_rows + 2 * (d // 8) * (tile_rows // 4) * 32 + d
    )
    # the merge's split groups (decode_tc_cuda.tc_merge_row): a max, a sum and a weight
    # each, the total, and their outputs, 4 floats a thread; at most one group per 16
    # threads (head size >= 64)
    merge = 3 * (TC_MERGE_THREADS // 16) + 1 + 4 * TC_MERGE_THREADS
    return TcDecodeGeometry(rows, nrg, tile_rows, nsplit, 4 * floats, 4 * merge)


def tc_splits(geo: TcDecodeGeometry, kv_end: int) -> tuple[int, int]:
    """(keys per split, splits) gqa_decode_tc uses for a batch row attending ``kv_end`` keys:
    the device's ``split_chunk`` arithmetic."""
    per = math.ceil(kv_end / geo.nsplit)
    chunk = max(TC_SPLIT_KEYS, _round_up(per, TC_SPLIT_KEYS))
    return chunk, max(1, math.ceil(kv_end / chunk))


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
