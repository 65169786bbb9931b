"""One GroupQueryAttention step planned for one input signature.

:func:`plan_step` checks the inputs' shapes and dtypes, picks the kernels and
their geometry and writes every scalar argument once, into small parameter
blocks in device memory; the callable it returns does only what must happen
per call: allocate the outputs and launch with array pointers. A signature is
the inputs' shapes and dtypes plus ``total_sequence_length``, so a
fixed-capacity decode loop plans once and then runs the lean path. Planning
copies the blocks to the device, so a signature's first call belongs outside
stream capture (capture follows warm-up runs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument
from onnxep.providers.inplace import array_address

from .attention_cuda import FLAT_BLOCK, flat_grid
from .decode_tc_cuda import tc_kernels, tc_names
from .flash_prefill import plan_gqa
from .gqa_cuda import ATTN, DECODE, FILL, PREPARE
from .gqa_geometry import (
    BLOCK,
    TC_SPLIT_KEYS,
    plan_decode,
    plan_decode_tc,
    plan_prefill,
    route_decode,
    uses_decode,
)
from .reduce_cuda import all_aligned

_OP = "GroupQueryAttention"
# Positions of the arrays in the tuple a step takes (total_sequence_length is apart).
QUERY, KEY, VALUE, PAST_K, PAST_V, SEQLENS, COS, SIN, POS, BIAS, SINK, QSEQ = range(12)


def _bias_strides(bias, b: int, nh: int, s: int, total: int) -> tuple[int, int, int, int]:
    """Element strides of a (B|1, N|1, S|1, L|1) bias, 0 along broadcast dims."""
    want = (b, nh, s)
    if bias.ndim != 4 or any(n not in (1, w) for n, w in zip(bias.shape[:3], want, strict=True)):
        raise InvalidArgument(
            f"{_OP}: attention_bias of shape {tuple(bias.shape)} does not broadcast to "
            f"({b}, {nh}, {s}, total_sequence_length)"
        )
    if bias.shape[3] != 1 and bias.shape[3] < total:
        raise InvalidArgument(
            f"{_OP}: attention_bias has {bias.shape[3]} key columns, fewer than "
            f"total_sequence_length ({total})"
        )
    _, n, q, k = bias.shape
    full = (n * q * k, q * k, k, 1)
    return tuple(0 if size == 1 else st for size, st in zip(bias.shape, full, strict=True))


def _check_inputs(cfg, ins: Sequence[Any]) -> tuple[int, int, int, int, bool]:
    """(b, s, head size, past length, packed) after checking every input's shape."""
    nh, nkv = cfg.num_heads, cfg.kv_num_heads
    query, key, value, past_k, past_v = ins[QUERY], ins[KEY], ins[VALUE], ins[PAST_K], ins[PAST_V]
    if query.ndim != 3:
        raise InvalidArgument(f"{_OP}: query must be 3-D, got shape {tuple(query.shape)}")
    b, s, width = query.shape
    packed = key is None
    if packed:
        if value is not None:
            raise InvalidArgument(f"{_OP}: value given without key")
        heads = nh + 2 * nkv
        if width % heads:
            raise InvalidArgument(
                f"{_OP}: packed QKV width {width} is not a multiple of "
                f"num_heads + 2 * kv_num_heads = {heads}"
            )
        d = width // heads
    else:
        if value is None or width % nh:
            raise InvalidArgument(
                f"{_OP}: needs key and value together, and a query width ({width}) "
                f"that is a multiple of num_heads ({nh})"
            )
        d = width // nh
        if key.shape != (b, s, nkv * d) or value.shape != key.shape:
            raise InvalidArgument(
                f"{_OP}: key {tuple(key.shape)} and value {tuple(value.shape)} must both be "
                f"({b}, {s}, {nkv * d})"
            )
    if (past_k is None) != (past_v is None):
        raise InvalidArgument(f"{_OP}: past_key and past_value must be given together")
    pl = 0
    if past_k is not None:
        pl = past_k.shape[2] if past_k.ndim == 4 else -1
        if past_k.shape != (b, nkv, pl, d) or past_v.shape != past_k.shape:
            raise InvalidArgument(
                f"{_OP}: past_key {tuple(past_k.shape)} and past_value "
                f"{tuple(past_v.shape)} must both be ({b}, {nkv}, past_len, {d})"
            )
        if past_k.dtype != query.dtype or past_v.dtype != query.dtype:
            raise InvalidArgument(
                f"{_OP}: past_key/past_value of dtype {past_k.dtype}/{past_v.dtype} "
                f"must match the query's {query.dtype}"
            )
    seqlens = ins[SEQLENS]
    if seqlens is None or seqlens.size != b:
        raise InvalidArgument(f"{_OP}: seqlens_k must hold one length per batch row ({b})")
    if ins[QSEQ] is not None and ins[QSEQ].size != b:
        raise InvalidArgument(f"{_OP}: query_seqlens must hold one length per batch row ({b})")
    if ins[SINK] is not None and ins[SINK].size != nh:
        raise InvalidArgument(f"{_OP}: head_sink must hold num_heads ({nh}) values")
    return b, s, d, pl, packed


def plan_step(
    cfg,
    fns_by_dtype: dict,
    sms: int,
    xp: Any,
    total: int,
    ins: Sequence[Any],
    flash=None,
    report=None,
    capability: int = 0,
):
    """The callable running one step for inputs shaped like ``ins`` (values are never read).

    ``flash`` (``flash_prefill.Kernels``): a prefill whose route allows it runs the
    tensor-core kernel instead of gqa_prefill. ``report`` is ``(flag words, node id)`` of the
    provider's error record, or None; ``capability`` the device's compute capability
    (major * 10 + minor), which with the shapes routes a decode step. The route taken, of
    either, is ``step.route``."""
    dt = ins[QUERY].dtype
    fns = fns_by_dtype.get(dt)
    if fns is None:
        raise InvalidArgument(f"{_OP}: query of dtype {dt} is not float32 or float16")
    nh, nkv = cfg.num_heads, cfg.kv_num_heads
    b, s, d, pl, packed = _check_inputs(cfg, ins)
    has_past = ins[PAST_K] is not None
    cap = max(total, pl) if has_past else total  # present's length, as on the CPU
    share = has_past and cap == pl  # present IS the past buffer
    flag, node_id = report if report is not None else (None, -1)

    want = {SEQLENS: np.int32, QSEQ: np.int32, POS: np.int64}
    rot, cache_rows, pos_mode, used = 0, 1, 0, [QUERY, KEY, VALUE, PAST_K, PAST_V, SEQLENS, QSEQ]
    if cfg.do_rotary:
        cos, sin = ins[COS], ins[SIN]
        if cos is None or sin is None or cos.ndim != 2 or sin.shape != cos.shape:
            raise InvalidArgument(
                f"{_OP}: do_rotary needs 2-D cos_cache and sin_cache of one shape"
            )
        rot, cache_rows = 2 * cos.shape[1], cos.shape[0]
        if rot > d:
            raise InvalidArgument(
                f"{_OP}: cos_cache has {cos.shape[1]} columns: rotary dim {rot} exceeds "
                f"the head size {d}"
            )
        used += [COS, SIN]
        if ins[POS] is not None:
            if ins[POS].shape != (b, s):
                raise InvalidArgument(
                    f"{_OP}: position_ids must be ({b}, {s}), got {tuple(ins[POS].shape)}"
                )
            used.append(POS)
            # onnxruntime reads only the first id on a first prompt
            pos_mode = 1 if (s > 1 and s == total and ins[QSEQ] is None) else 2
    # A row attends its seqlens_k + 1 tokens, as onnxruntime does (total_sequence_length only
    # sizes the present cache); they must fit it, and a bias' key columns (device-checked).
    kv_limit = cap
    bias_strides = (0, 0, 0, 0)
    if ins[BIAS] is not None:
        bias_strides = _bias_strides(ins[BIAS], b, nh, s, total)
        if ins[BIAS].shape[3] != 1:
            kv_limit = min(cap, ins[BIAS].shape[3])
        used.append(BIAS)
    if ins[SINK] is not None:
        used.append(SINK)
    used = [i for i in used if ins[i] is not None]
    # inputs of another dtype than the kernel reads are converted (rare: int64 lengths...)
    convert = [(i, want.get(i, dt)) for i in used if ins[i].dtype != want.get(i, dt)]

    cache_shape = (b, nkv, cap, d)
    fill = fns["gqa_kv_fill"]
    fill_n = b * nkv * cap * d
    fill_grid = (flat_grid(fill_n, sms),)
    fill_prm = FILL.to_device(xp, n=fill_n, C=cap, PL=pl, D=d) if fill_n and not share else None
    width = ins[QUERY].shape[2]
    offsets = (nh * d, (nh + nkv) * d) if packed else (0, 0)
    rows = (width, width, width) if packed else (width, nkv * d, nkv * d)
    scale = cfg.scale if cfg.scale else 1.0 / math.sqrt(d)
    n_new = b * s * (nh + 2 * nkv) * d  # 0: nothing to compute
    y_shape = (b, s, nh * d)
    empty, ascontig = xp.empty, xp.ascontiguousarray

    # the 16-byte kernels' case: head rows, offsets, row strides and the rotary split are
    # whole chunks (the arrays' alignment is checked per call)
    v = 16 // np.dtype(dt).itemsize
    chunked = (
        d % v == 0
        and rot % (v if cfg.interleaved else 2 * v) == 0
        and all(x % v == 0 for x in (*offsets, *rows))
    )
    route = None  # the route of the decode or the prefill kernel
    if uses_decode(s):

        def decode_params(nsplit: int, nrows: int, nrg: int, ktile: int) -> Any:
            return DECODE.to_device(
                xp, k_off=offsets[0], v_off=offsets[1], q_row=rows[0], k_row=rows[1],
                v_row=rows[2], bsb=bias_strides[0], bsh=bias_strides[1], bsj=bias_strides[3],
                B=b, nh=nh, nkv=nkv, D=d, C=cap, kv_limit=kv_limit, nsplit=nsplit, rows=nrows,
                nrg=nrg, ktile=ktile, rot=rot, interleaved=cfg.interleaved, pos_mode=pos_mode,
                cache_rows=cache_rows, smooth=cfg.smooth, window=cfg.window, causal=cfg.causal,
                scale=scale, softcap=cfg.softcap, node=node_id,
            )  # fmt: skip

        core = fns["gqa_decode"]
        cgeo = plan_decode(b, nh, nkv, d, kv_limit, sms)
        cprm = decode_params(cgeo.nsplit, cgeo.rows, cgeo.nrg, cgeo.ktile)
        cgrid, cblock = (cgeo.nsplit, nkv * cgeo.nrg, b), (cgeo.threads,)
        cpart_n = b * nh * cgeo.nsplit * (d + 2) if cgeo.nsplit > 1 else 0
        # split counters: zero between steps (the merging block resets its own)
        done = xp.zeros(b * nkv * cgeo.nrg, dtype=np.int32) if cpart_n else None

        def attend(query, key, value, kc, vc, seqlens, cos, sin, pos, bias, sink, qseq):
            y = empty(y_shape, dtype=dt)
            part = empty(cpart_n, dtype=np.float32) if cpart_n else None
            args = (query, key, value, kc, vc, seqlens, qseq, cos, sin, pos, bias, sink, part,
                    done, y, flag, cprm)  # fmt: skip
            core(cgrid, cblock, args, shared_mem=cgeo.smem)
            return y

        # Which kernel: from the dtype, the head size, the heads per KV head and the device.
        route = route_decode(dt.name, d, nh // nkv, capability)
        if route.kernel == "tensor-core":
            core_attend = attend
            geo = plan_decode_tc(b, nh, nkv, d, kv_limit, sms)
            prm = decode_params(geo.nsplit, geo.rows, geo.nrg, TC_SPLIT_KEYS)
            decode, merge = tc_kernels(tc_names(d, geo.tile_rows), xp)
            grid, block = (geo.nsplit, nkv * geo.nrg, b), (geo.threads,)
            merge_grid, merge_block = (b * nh,), (geo.merge_threads,)
            part_n = b * nh * geo.nsplit * (d + 2) if geo.nsplit > 1 else 0

            def attend(query, key, value, kc, vc, seqlens, cos, sin, pos, bias, sink, qseq):
                if (array_address(kc) | array_address(vc)) % 16:  # a cache view off 16 bytes
                    return core_attend(query, key, value, kc, vc, seqlens, cos, sin, pos, bias,
                                       sink, qseq)  # fmt: skip
                y = empty(y_shape, dtype=dt)
                part = empty(part_n, dtype=np.float32) if part_n else None
                vec = (
                    chunked
                    and not (array_address(query) | array_address(key) | array_address(value)) % 16
                )
                decode(grid, block, (query, key, value, kc, vc, seqlens, qseq, cos, sin, pos,
                                     bias, sink, part, y, flag, prm, np.int64(vec)),
                       shared_mem=geo.smem)  # fmt: skip
                if part_n:  # rows held by one split were written by the decode kernel
                    merge(merge_grid, merge_block, (seqlens, sink, part, y, prm),
                          shared_mem=geo.merge_smem)  # fmt: skip
                return y

    else:
        prep = fns["gqa_prepare"]
        prep_v = fns["gqa_prepare_v"] if chunked and n_new // v < 2**31 else None
        prep_prm = PREPARE.to_device(
            xp, n=n_new, k_off=offsets[0], v_off=offsets[1], q_row=rows[0], k_row=rows[1],
            v_row=rows[2], B=b, S=s, nh=nh, nkv=nkv, D=d, C=cap, kv_limit=kv_limit, rot=rot,
            interleaved=cfg.interleaved, pos_mode=pos_mode, cache_rows=cache_rows, node=node_id,
        )  # fmt: skip
        prep_grid = (flat_grid(n_new, sms),)
        prep_v_grid = (flat_grid(max(1, n_new // v), sms),)
        geo = plan_prefill(d)
        prm = ATTN.to_device(
            xp, bsb=bias_strides[0], bsh=bias_strides[1], bss=bias_strides[2],
            bsj=bias_strides[3], S=s, nh=nh, nkv=nkv, D=d, C=cap, kv_limit=kv_limit,
            BQ=geo.bq, BK=geo.bk, smooth=cfg.smooth, window=cfg.window, causal=cfg.causal,
            scale=scale, softcap=cfg.softcap,
        )  # fmt: skip
        prefill = fns["gqa_prefill"]
        grid, block = ((s + geo.bq - 1) // geo.bq, nh, b), (BLOCK,)
        qbuf_shape = (b, nh, s, d)
        route, fast = (None, None) if flash is None else plan_gqa(
            flash, xp, dt, cfg, b=b, s=s, d=d, cap=cap, kv_limit=kv_limit,
            bias_strides=bias_strides, scale=scale, sms=sms,
        )  # fmt: skip

        def attend(query, key, value, kc, vc, seqlens, cos, sin, pos, bias, sink, qseq):
            qbuf, y = empty(qbuf_shape, dtype=dt), empty(y_shape, dtype=dt)
            vec = prep_v is not None and all_aligned((query, key, value, qbuf, kc, vc))
            (prep_v if vec else prep)(
                prep_v_grid if vec else prep_grid, (FLAT_BLOCK,),
                (query, key, value, qbuf, kc, vc, seqlens, qseq, cos, sin, pos, flag, prep_prm),
            )  # fmt: skip
            # the tensor-core kernel declines only arrays off a 16-byte boundary
            if fast is None or not fast(qbuf, kc, vc, seqlens, qseq, None, None, None, None,
                                        bias, sink, y):  # fmt: skip
                prefill(grid, block, (qbuf, kc, vc, seqlens, qseq, bias, sink, y, prm),
                        shared_mem=geo.smem)  # fmt: skip
            return y

    def step(ins: list) -> tuple:
        for i, to in convert:
            ins[i] = ascontig(ins[i].astype(to))
        for i in used:
            if not ins[i].flags.c_contiguous:
                ins[i] = ascontig(ins[i])
        query, key, value, past_k, past_v, seqlens, cos, sin, pos, bias, sink, qseq = ins
        if share:
            kc, vc = past_k, past_v
        else:
            kc, vc = empty(cache_shape, dtype=dt), empty(cache_shape, dtype=dt)
            if fill_n:
                fill(fill_grid, (FLAT_BLOCK,), (past_k, past_v, kc, vc, fill_prm))
        if not n_new:
            return (empty(y_shape, dtype=dt), kc, vc)
        if packed:
            key, value = query, query
        return (attend(query, key, value, kc, vc, seqlens, cos, sin, pos, bias, sink, qseq), kc, vc)

    step.route = route  # type: ignore[attr-defined]
    return step


def host_total(v: Any) -> int:
    """total_sequence_length from host memory (the kernel declares it a host input)."""
    if type(v) is np.ndarray and v.size == 1:
        return int(v.item())
    if isinstance(v, np.ndarray | np.generic | int):
        return int(np.asarray(v).reshape(-1)[0])
    raise InvalidArgument(
        f"{_OP}: total_sequence_length must be a host array (the kernel declares it a host "
        f"input), got {type(v).__name__}"
    )
