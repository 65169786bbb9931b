"""One ONNX Attention call planned for one input signature (shapes and dtypes).

:func:`plan_step` checks the inputs' shapes, derives every stride and the
launch geometry, and writes the kernels' scalars once into parameter blocks
in device memory; the callable it returns only allocates the outputs and
launches. Planning copies the blocks to the device, so a signature's first
call belongs outside stream capture (capture follows warm-up runs). Nothing
on the run path reads device memory on the host or calls cuBLAS.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument
from onnxep.providers.inplace import array_address

from .attention23_cuda import ATTN, CONCAT
from .attention_cuda import FLAT_BLOCK, flat_grid
from .decode_tc_cuda import ATT_DECODE, att_names, tc_kernels
from .flash_prefill import plan_attention
from .gqa_geometry import (
    BLOCK,
    MAX_HEAD_SIZE,
    TC_SPLIT_KEYS,
    plan_decode_tc,
    plan_prefill,
    route_decode,
)

_OP = "Attention"
Q, K, V, MASK, PAST_K, PAST_V, NONPAD = range(7)
_FLOAT_MASKS = (np.dtype(np.float32), np.dtype(np.float16))


@dataclass(frozen=True)
class AttentionConfig:
    """The node's attributes, parsed once (``left``/``right`` -1: no window)."""

    q_heads: int | None
    kv_heads: int | None
    scale: float | None
    softcap: float
    causal: bool
    left: int
    right: int


def _heads(x, heads: int | None, name: str, attr: str) -> tuple[int, int, int, int]:
    """(B, H, S, D) of a 3-D or 4-D input."""
    if x.ndim == 4:
        return tuple(int(n) for n in x.shape)  # type: ignore[return-value]
    if x.ndim != 3:
        raise InvalidArgument(f"{_OP}: {name} must be 3-D or 4-D, got shape {tuple(x.shape)}")
    if heads is None or heads <= 0 or x.shape[2] % heads:
        raise InvalidArgument(
            f"{_OP}: 3-D {name} of shape {tuple(x.shape)} needs attribute {attr} (got "
            f"{heads}) dividing its last dimension"
        )
    b, s, width = (int(n) for n in x.shape)
    return b, heads, s, width // heads


def _layout(x, heads: int) -> tuple[int, int, int]:
    """Element strides (batch, head, row) of a contiguous 3-D or 4-D input; channels are 1."""
    if x.ndim == 4:
        _, h, s, d = x.shape
        return h * s * d, s * d, d
    _, s, width = x.shape
    return s * width, width // heads, width


def _mask_strides(mask, b: int, hq: int, sq: int, sk: int) -> tuple[int, int, int, int]:
    """(batch, head, row) element strides of a mask broadcast to (B, Hq, Sq, cols), and cols."""
    if mask.ndim < 1 or mask.ndim > 4:
        raise InvalidArgument(f"{_OP}: attn_mask must have rank 1 to 4, got {tuple(mask.shape)}")
    shape = (1,) * (4 - mask.ndim) + tuple(int(n) for n in mask.shape)
    cols = shape[3]
    want = (b, hq, sq)
    if any(n not in (1, w) for n, w in zip(shape[:3], want, strict=True)) or cols > sk:
        raise InvalidArgument(
            f"{_OP}: attn_mask of shape {tuple(mask.shape)} does not broadcast to "
            f"({b}, {hq}, {sq}, <= {sk} keys)"
        )
    full = (shape[1] * shape[2] * cols, shape[2] * cols, cols)
    st = tuple(0 if n == 1 else f for n, f in zip(shape[:3], full, strict=True))
    return st[0], st[1], st[2], cols


#: Blocks per SM below which the keys are split across blocks too.
SPLIT_BLOCKS_PER_SM = 2
#: Fewest key tiles one split takes (fewer make the partial results cost more than they save).
MIN_TILES_PER_SPLIT = 4


def split_keys(blocks: int, keys: int, bk: int, sms: int) -> tuple[int, int]:
    """(splits, keys per split) over ``keys``: enough splits that the ``blocks`` the query
    tiles make fill SPLIT_BLOCKS_PER_SM per SM, each split at least MIN_TILES_PER_SPLIT
    key tiles; one split (chunk 0, unused) when the query tiles fill the device."""
    want = math.ceil(SPLIT_BLOCKS_PER_SM * sms / max(1, blocks))
    n = min(want, keys // (MIN_TILES_PER_SPLIT * bk))
    if n <= 1:
        return 1, 0
    chunk = math.ceil(math.ceil(keys / n) / bk) * bk
    return math.ceil(keys / chunk), chunk


def plan_step(
    cfg: AttentionConfig,
    fns_by_dtype: dict,
    sms: int,
    xp: Any,
    ins: Sequence[Any],
    flash=None,
    capability: int = 0,
):
    """The callable running one call for inputs shaped like ``ins`` (values are never read).

    A single query row (decode) runs the tensor-core decode kernel where ``capability`` (the
    device's, major * 10 + minor) and the shapes route it there; other calls whose route
    allows it run the tensor-core prefill kernel of ``flash`` (``flash_prefill.Kernels``)
    instead of att_prefill. The route taken is ``step.route``."""
    q, k, v = ins[Q], ins[K], ins[V]
    dt = q.dtype
    fns = fns_by_dtype.get(dt)
    if fns is None:
        raise InvalidArgument(f"{_OP}: Q of dtype {dt} is not float32 or float16")
    for name, x in (("K", k), ("V", v), ("past_key", ins[PAST_K]), ("past_value", ins[PAST_V])):
        if x is not None and x.dtype != dt:
            raise InvalidArgument(f"{_OP}: {name} is {x.dtype}, Q is {dt}; they must match here")
    if not q.ndim == k.ndim == v.ndim:
        raise InvalidArgument(
            f"{_OP}: Q, K and V must all be 3-D or all 4-D, got ranks {q.ndim}, {k.ndim}, {v.ndim}"
        )
    b, hq, sq, d = _heads(q, cfg.q_heads, "Q", "q_num_heads")
    _, hkv, skv, dk = _heads(k, cfg.kv_heads, "K", "kv_num_heads")
    _, hv, sv, dv = _heads(v, cfg.kv_heads, "V", "kv_num_heads")
    if k.shape[0] != b or v.shape[0] != b or (hv, sv) != (hkv, skv) or dk != d:
        raise InvalidArgument(
            f"{_OP}: Q {tuple(q.shape)}, K {tuple(k.shape)} and V {tuple(v.shape)} disagree: "
            f"K needs Q's batch and head size {d}, V K's heads and length"
        )
    if hkv <= 0 or hq % hkv:
        raise InvalidArgument(f"{_OP}: {hq} query heads are not a multiple of {hkv} KV heads")
    for n, what in ((d, "Q/K"), (dv, "V")):
        if n < 1 or n > MAX_HEAD_SIZE:
            raise InvalidArgument(
                f"{_OP}: {what} head size {n} is outside the CUDA kernel's 1..{MAX_HEAD_SIZE}"
            )
    past_k, past_v = ins[PAST_K], ins[PAST_V]
    if (past_k is None) != (past_v is None):
        raise InvalidArgument(f"{_OP}: past_key and past_value must be given together")
    pl = 0
    if past_k is not None:
        pl = int(past_k.shape[2]) if past_k.ndim == 4 else -1
        if past_k.shape != (b, hkv, pl, d) or past_v.shape != (b, hkv, pl, dv):
            raise InvalidArgument(
                f"{_OP}: past_key {tuple(past_k.shape)} and past_value {tuple(past_v.shape)} "
                f"must be ({b}, {hkv}, past_len, {d}) and ({b}, {hkv}, past_len, {dv})"
            )
    has_past = past_k is not None
    total = pl + skv

    mask = ins[MASK]
    mask_kind, mst = None, (0, 0, 0, 0)
    convert_mask = None
    if mask is not None:
        mst = _mask_strides(mask, b, hq, sq, total)
        if mask.dtype == np.bool_:
            mask_kind = "b"
        elif mask.dtype in _FLOAT_MASKS:
            mask_kind = "f" if mask.dtype == np.float32 else "h"
        else:
            mask_kind, convert_mask = "f", np.float32  # added as float32, as the CPU kernel does
    nonpad = ins[NONPAD]
    if nonpad is not None and nonpad.shape != (b,):
        raise InvalidArgument(
            f"{_OP}: nonpad_kv_seqlen must have shape ({b},), got {tuple(nonpad.shape)}"
        )
    convert_nonpad = nonpad is not None and nonpad.dtype != np.int64

    geo = plan_prefill(max(d, dv))
    bq, bk = min(geo.bq, max(1, sq)), geo.bk
    smem = 4 * (bq * d + bk * (d + 1) + bk * dv + bq * bk + bq * dv + 3 * bq)
    if has_past:
        kst = (hkv * total * d, total * d, d)
        vst = (hkv * total * dv, total * dv, dv)
    else:
        kst, vst = _layout(k, hkv), _layout(v, hkv)
    qtiles = (sq + bq - 1) // bq
    nsplit, chunk = split_keys(qtiles * hq * b, total, bk, sms)
    rank3 = q.ndim == 3
    y_shape = (b, sq, hq * dv) if rank3 else (b, hq, sq, dv)
    yst = (sq * hq * dv, dv, hq * dv) if rank3 else (hq * sq * dv, sq * dv, dv)
    scale = cfg.scale if cfg.scale is not None else 1.0 / math.sqrt(d)
    qst = _layout(q, hq)
    prm = ATTN.to_device(
        xp, qsb=qst[0], qsh=qst[1], qss=qst[2],
        ksb=kst[0], ksh=kst[1], kss=kst[2], vsb=vst[0], vsh=vst[1], vss=vst[2],
        ysb=yst[0], ysh=yst[1], yss=yst[2], msb=mst[0], msh=mst[1], mss=mst[2], past=pl,
        Sq=sq, Sk=total, nh=hq, nkv=hkv, D=d, Dv=dv, BQ=bq, BK=bk, causal=int(cfg.causal),
        left=cfg.left, right=cfg.right, mask_cols=mst[3] if mask is not None else total,
        nonpad_offset=int(nonpad is not None and not has_past), nsplit=nsplit, chunk=chunk,
        scale=scale,
        softcap=cfg.softcap,
    )  # fmt: skip
    route, fast = (None, None) if flash is None else plan_attention(
        flash, xp, dt, cfg, b=b, hq=hq, hkv=hkv, d=d, dv=dv, sq=sq, total=total, past=pl,
        split=nsplit, strides=(qst, kst, vst, yst),
        mask=None if mask is None else mst, nonpad_offset=nonpad is not None and not has_past,
        scale=scale, sms=sms,
    )  # fmt: skip
    attn, reduce_ = fns["att_prefill"], fns["att_reduce"]
    grid = (qtiles * nsplit, hq, b)
    part_n = b * hq * sq * nsplit * (dv + 2) if nsplit > 1 else 0
    red_grid, red_block = (b * hq * sq,), (min(128, (dv + 31) // 32 * 32),)
    run_attn = b > 0 and sq > 0 and hq > 0 and dv > 0

    concat = fns["att_concat"]
    cat = []
    if has_past:
        for src, dd, shape in ((K, d, (b, hkv, total, d)), (V, dv, (b, hkv, total, dv))):
            n = b * hkv * total * dd
            st = _layout(ins[src], hkv)
            cprm = CONCAT.to_device(xp, n=n, sb=st[0], sh=st[1], ss=st[2], H=hkv, P=pl,
                                    L=total, D=dd)  # fmt: skip
            cat.append((src, shape, n, (flat_grid(n, sms),), cprm))
    block, flat_block = (BLOCK,), (FLAT_BLOCK,)
    empty, ascontig = xp.empty, xp.ascontiguousarray

    def step(ins: Sequence[Any]) -> tuple:
        q, k, v, mask, past_k, past_v, nonpad = (None if a is None else ascontig(a) for a in ins)
        if has_past:
            kv = []
            for (src, shape, n, cgrid, cprm), past in zip(cat, (past_k, past_v), strict=True):
                out = empty(shape, dtype=dt)
                if n:
                    concat(cgrid, flat_block, (past, (k, v)[src - K], out, cprm))
                kv.append(out)
            present_k, present_v = kv
            ka, va = present_k, present_v
        else:
            ka, va = k, v
            present_k, present_v = _heads_view(xp, k, hkv), _heads_view(xp, v, hkv)
        y = empty(y_shape, dtype=dt)
        if run_attn:
            mb = mf = mh = None
            if mask is not None:
                if convert_mask is not None:
                    mask = ascontig(mask.astype(convert_mask))
                if mask_kind == "b":
                    mb = mask.view(np.uint8)
                elif mask_kind == "f":
                    mf = mask
                else:
                    mh = mask
            if convert_nonpad:
                nonpad = ascontig(nonpad.astype(np.int64))
            if decode is not None and not (array_address(ka) | array_address(va)) % 16:
                decode(q, ka, va, mb, mf, mh, nonpad, y)
            # the tensor-core prefill kernel declines only arrays off a 16-byte boundary
            elif fast is None or not fast(q, ka, va, None, None, nonpad, mb, mf, mh, None, None, y):
                part = empty(part_n, dtype=np.float32) if part_n else None
                attn(grid, block, (q, ka, va, mb, mf, mh, nonpad, part, y, prm), shared_mem=smem)
                if part_n:
                    reduce_(red_grid, red_block, (part, y, prm))
        return (y, present_k, present_v, None)

    # A single query row (decode) on tensor cores where the route allows it, else the tiled
    # kernel's split keys (never the prefill kernel, whose query tiles one row would waste).
    decode = None
    if sq == 1:
        fast, route = None, route_decode(dt.name, d, hq // hkv, capability, dv)
        if route.kernel == "tensor-core" and run_attn:
            external = nonpad is not None and not has_past  # the row sits at nonpad - 1
            decode = _tc_decode(xp, sms, b, hq, hkv, d, total, qst, kst, vst, yst, mst, pl,
                                cfg, scale, mask is not None, external)  # fmt: skip
    step.route = route  # type: ignore[attr-defined]
    return step


def _tc_decode(xp, sms, b, hq, hkv, d, total, qst, kst, vst, yst, mst, past, cfg, scale,
               has_mask, nonpad_offset):  # fmt: skip
    """``decode(q, k, v, mask_b, mask_f, mask_h, nonpad, y)``: att_decode_tc then, where a
    row's keys are split, att_decode_merge (``decode_tc_cuda.py``)."""
    geo = plan_decode_tc(b, hq, hkv, d, total, sms)
    prm = ATT_DECODE.to_device(
        xp, qsb=qst[0], qsh=qst[1], ksb=kst[0], ksh=kst[1], kss=kst[2], vsb=vst[0], vsh=vst[1],
        vss=vst[2], ysb=yst[0], ysh=yst[1], msb=mst[0], msh=mst[1], past=past, B=b, nh=hq,
        nkv=hkv, Sk=total, causal=int(cfg.causal), left=cfg.left, right=cfg.right,
        mask_cols=mst[3] if has_mask else total, has_mask=int(has_mask),
        nonpad_offset=int(nonpad_offset), nsplit=geo.nsplit, rows=geo.rows, nrg=geo.nrg,
        ktile=TC_SPLIT_KEYS, scale=scale, softcap=cfg.softcap,
    )  # fmt: skip
    attn, merge = tc_kernels(att_names(d, geo.tile_rows), xp)
    grid, block = (geo.nsplit, hkv * geo.nrg, b), (geo.threads,)
    merge_grid, merge_block = (b * hq,), (geo.merge_threads,)
    part_n = b * hq * geo.nsplit * (d + 2) if geo.nsplit > 1 else 0
    empty = xp.empty

    def decode(q, k, v, mb, mf, mh, nonpad, y) -> None:
        part = empty(part_n, dtype=np.float32) if part_n else None
        attn(grid, block, (q, k, v, mb, mf, mh, nonpad, part, y, prm), shared_mem=geo.smem)
        if part_n:  # rows held by one split were written by the decode kernel
            merge(merge_grid, merge_block, (nonpad, part, y, prm), shared_mem=geo.merge_smem)

    return decode


def _heads_view(xp: Any, x: Any, heads: int) -> Any:
    """A 3-D (B, S, H*D) input as the (B, H, S, D) present it stands for (a view)."""
    if x.ndim == 4:
        return x
    b, s, width = x.shape
    return xp.transpose(xp.reshape(x, (b, s, heads, width // heads)), (0, 2, 1, 3))
