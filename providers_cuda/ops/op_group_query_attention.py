"""com.microsoft GroupQueryAttention on CUDA: prefill and split-K decode, fp32 and fp16.

Semantics are the CPU kernel's (``providers/ops/op_group_query_attention.py``):
per batch row ``T = seqlens_k[b] + 1`` tokens are valid after the step,
``Q = min(S, T)`` (or ``query_seqlens[b]``) are new, written to cache rows
``[T - Q, T)``; the causal mask, the local window and rotary positions follow
from there. ``seqlens_k``, ``query_seqlens`` and ``position_ids`` are read on
the device only.

``total_sequence_length`` is a host input, as in onnxruntime's CUDA kernel
(real exports compute it from the attention mask's shape, so it costs no
device read): it sizes the present cache exactly as the CPU kernel and
onnxruntime do, ``max(total, past capacity)``, and bounds the keys read.
When that equals the past buffer's capacity the present cache IS the past
buffer (onnxruntime's past_present_share_buffer): the new rows are written
into it in place and it is returned as present, so a fixed-capacity decode
loop moves only the new rows. Otherwise a fresh cache is filled from the past.

A step is three launches at most (prepare, attention, split-K reduce), plus
one to fill a fresh cache; nothing synchronizes or reads device memory on the
host, so the step can be captured in a CUDA graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from onnxep.errors import InvalidArgument, NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from ._attention_cuda import FLAT_BLOCK, ctype_of, flat_grid, sm_count
from ._gqa_cuda import (
    BLOCK,
    GQA_SOURCE,
    MAX_HEAD_SIZE,
    NAME_EXPRESSIONS,
    plan_decode,
    plan_prefill,
    uses_decode,
)

_UNSUPPORTED_INPUTS = {12: "k_scale", 13: "v_scale", 14: "q_norm_weight", 15: "k_norm_weight"}
_OP = "GroupQueryAttention"


@dataclass(frozen=True)
class GqaConfig:
    """The node's attributes, parsed once."""

    num_heads: int
    kv_num_heads: int
    scale: float  # 0: 1/sqrt(head_size)
    softcap: float
    window: int  # -1: no local window
    causal: bool
    do_rotary: bool
    interleaved: bool
    smooth: bool


def parse_gqa(node: NodeInfo) -> GqaConfig:
    """Attributes checked; raises NotSupported, with the reason, for what CUDA cannot run."""
    nh = int(node.attr("num_heads"))
    nkv = int(node.attr("kv_num_heads"))
    if nh <= 0 or nkv <= 0 or nh % nkv:
        raise NotSupported(
            f"{_OP}: num_heads {nh} must be a positive multiple of kv_num_heads {nkv}"
        )
    if node.attr("sliding_window_cache", 0):
        raise NotSupported(f"{_OP}: sliding_window_cache=1 is not supported")
    for i, name in _UNSUPPORTED_INPUTS.items():
        if node.has_input(i):
            raise NotSupported(f"{_OP}: input {name} (quantized cache / QK norm) is not supported")
    for attr in ("k_quant_type", "v_quant_type"):
        q = node.attr(attr, "NONE")
        if (q.decode() if isinstance(q, bytes) else q) != "NONE":
            raise NotSupported(f"{_OP}: {attr} (quantized KV cache) is not supported")
    if node.has_output(3):
        raise NotSupported(f"{_OP}: output_qk is not produced on CUDA (the CPU provider has it)")
    return GqaConfig(
        num_heads=nh,
        kv_num_heads=nkv,
        scale=float(node.attr("scale", 0.0)),
        softcap=float(node.attr("softcap", 0.0)),
        window=int(node.attr("local_window_size", -1)),
        causal=bool(node.attr("causal", 1)),
        do_rotary=bool(node.attr("do_rotary", 0)),
        interleaved=bool(node.attr("rotary_interleaved", 0)),
        smooth=bool(node.attr("smooth_softmax", 0)),
    )


def static_head_size(node: NodeInfo, cfg: GqaConfig) -> int | None:
    """Head size from the query's declared width, when it is a known integer."""
    q = node.inputs[0] if node.inputs else None
    width = q.shape[-1] if q is not None and q.shape else None
    if not isinstance(width, int):
        return None
    heads = cfg.num_heads if node.has_input(1) else cfg.num_heads + 2 * cfg.kv_num_heads
    return width // heads if width % heads == 0 else None


def _kernels(dtype) -> dict:
    """``{dtype: {kernel name: function}}`` compiled now, for one dtype or (unknown) both."""
    from onnxep.providers_cuda import nvrtc

    dts = (np.float32, np.float16) if dtype is None else (dtype,)
    return {
        np.dtype(dt): {
            name: nvrtc.function(GQA_SOURCE, f"{name}<{ctype_of(dt)}>", NAME_EXPRESSIONS)
            for name in ("gqa_prepare", "gqa_kv_fill", "gqa_decode", "gqa_reduce", "gqa_prefill")
        }
        for dt in dts
    }


def _contig(xp, a):
    return a if a is None or a.flags.c_contiguous else xp.ascontiguousarray(a)


def _as(xp, a, dtype):
    if a is None:
        return None
    return _contig(xp, a) if a.dtype == dtype else xp.ascontiguousarray(a.astype(dtype))


def _host_int(v, what: str) -> int:
    if isinstance(v, np.ndarray | np.generic | int):
        return int(np.asarray(v).reshape(-1)[0])
    raise InvalidArgument(
        f"{_OP}: {what} must be in host memory (the kernel declares it a host input), "
        f"got {type(v).__name__}"
    )


def _bias_strides(bias, b: int, nh: int, s: int, kv_limit: int) -> tuple[int, int, int, int]:
    """Element strides of a (B|1, N|1, S|1, L|1) bias, 0 along broadcast dims."""
    want = (b, nh, s)
    if bias.ndim != 4 or any(n not in (1, w) for n, w in zip(bias.shape[:3], want, strict=True)):
        raise InvalidArgument(
            f"{_OP}: attention_bias of shape {tuple(bias.shape)} does not broadcast to "
            f"({b}, {nh}, {s}, total_sequence_length)"
        )
    if bias.shape[3] != 1 and bias.shape[3] < kv_limit:
        raise InvalidArgument(
            f"{_OP}: attention_bias has {bias.shape[3]} key columns, fewer than the "
            f"{kv_limit} keys attended"
        )
    full = (bias.shape[1] * bias.shape[2] * bias.shape[3], bias.shape[2] * bias.shape[3])
    full = (*full, bias.shape[3], 1)
    return tuple(0 if n == 1 else st for n, st in zip(bias.shape, full, strict=True))


@kernel(
    _OP,
    since=1,
    domain="com.microsoft",
    dtypes={0: ("float", "float16")},
    host_inputs=(6,),
    inplace=((3, 1), (4, 2)),
    capture_safe=True,
)
def group_query_attention(node: NodeInfo, xp):
    cfg = parse_gqa(node)
    hd = static_head_size(node, cfg)
    if hd is not None and hd > MAX_HEAD_SIZE:
        raise NotSupported(f"{_OP}: head size {hd} is above the CUDA kernel's {MAX_HEAD_SIZE}")
    fns_by_dtype = _kernels(node.input_dtype(0))
    sms = sm_count()
    nh, nkv = cfg.num_heads, cfg.kv_num_heads
    i32, i64, f32 = np.int32, np.int64, np.float32
    geometry: dict[tuple, object] = {}

    def run(
        query,
        key=None,
        value=None,
        past_k=None,
        past_v=None,
        seqlens_k=None,
        total_len=None,
        cos=None,
        sin=None,
        position_ids=None,
        attn_bias=None,
        head_sink=None,
        *rest,
    ):
        qseq = rest[4] if len(rest) > 4 else None
        dt = query.dtype
        fns = fns_by_dtype.get(dt)
        if fns is None:
            raise InvalidArgument(f"{_OP}: query of dtype {dt} is not float32 or float16")
        if query.ndim != 3:
            raise InvalidArgument(f"{_OP}: query must be 3-D, got shape {tuple(query.shape)}")
        b, s, width = query.shape
        if key is None:
            if value is not None:
                raise InvalidArgument(f"{_OP}: value given without key")
            heads = nh + 2 * nkv
            if width % heads:
                raise InvalidArgument(
                    f"{_OP}: packed QKV width {width} is not a multiple of "
                    f"num_heads + 2 * kv_num_heads = {heads}"
                )
            d = width // heads
            query = _contig(xp, query)
            ksrc = vsrc = query
            k_off, v_off, q_row = nh * d, (nh + nkv) * d, width
            k_row = v_row = width
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
            query, ksrc, vsrc = _contig(xp, query), _as(xp, key, dt), _as(xp, value, dt)
            k_off = v_off = 0
            q_row, k_row, v_row = width, nkv * d, nkv * d
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
            if past_k.dtype != dt or past_v.dtype != dt:
                raise InvalidArgument(
                    f"{_OP}: past_key/past_value of dtype {past_k.dtype}/{past_v.dtype} "
                    f"must match the query's {dt}"
                )
        if seqlens_k is None or seqlens_k.size != b:
            raise InvalidArgument(f"{_OP}: seqlens_k must hold one length per batch row ({b})")
        total = _host_int(total_len, "total_sequence_length")
        cap = total if past_k is None else max(total, pl)  # present's length, as on the CPU
        kv_limit = total  # keys at or past total_sequence_length are never attended

        key_ = (b, s, d, cap)
        geo = geometry.get(key_)
        if geo is None:
            geo = plan_decode(b, s, nh, nkv, d, cap, sms) if uses_decode(s) else plan_prefill(d)
            geometry[key_] = geo

        seqlens_k = _as(xp, seqlens_k, np.int32)
        qseq = _as(xp, qseq, np.int32)
        rot, cache_rows, pos_mode, pos = 0, 1, 0, None
        if cfg.do_rotary:
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
            cos, sin = _as(xp, cos, dt), _as(xp, sin, dt)
            if position_ids is not None:
                if position_ids.shape != (b, s):
                    raise InvalidArgument(
                        f"{_OP}: position_ids must be ({b}, {s}), got {tuple(position_ids.shape)}"
                    )
                pos = _as(xp, position_ids, np.int64)
                # onnxruntime reads only the first id on a first prompt
                pos_mode = 1 if (s > 1 and s == total and qseq is None) else 2

        if past_k is not None and cap == pl:
            kc, vc = _contig(xp, past_k), _contig(xp, past_v)  # present IS the past buffer
        else:
            past_k, past_v = _contig(xp, past_k), _contig(xp, past_v)
            kc = xp.empty((b, nkv, cap, d), dtype=dt)
            vc = xp.empty((b, nkv, cap, d), dtype=dt)
            n = kc.size
            if n:
                fns["gqa_kv_fill"](
                    (flat_grid(n, sms),),
                    (FLAT_BLOCK,),
                    (past_k, past_v, kc, vc, i64(n), i32(cap), i32(pl), i32(d)),
                )  # fmt: skip
        qbuf = xp.empty((b, nh, s, d), dtype=dt)
        y = xp.empty((b, s, nh * d), dtype=dt)
        n = b * s * (nh + 2 * nkv) * d
        if n == 0:
            return (y, kc, vc)
        fns["gqa_prepare"](
            (flat_grid(n, sms),),
            (FLAT_BLOCK,),
            (query, ksrc, vsrc, i64(k_off), i64(v_off), i64(q_row), i64(k_row), i64(v_row),
             qbuf, kc, vc, seqlens_k, qseq, cos, sin, pos, i64(n), i32(s), i32(nh), i32(nkv),
             i32(d), i32(cap), i32(rot), i32(cfg.interleaved), i32(pos_mode), i32(cache_rows)),
        )  # fmt: skip

        bias = _as(xp, attn_bias, dt)
        bs = (0, 0, 0, 0) if bias is None else _bias_strides(bias, b, nh, s, kv_limit)
        sink = _as(xp, head_sink, dt)
        if sink is not None and sink.size != nh:
            raise InvalidArgument(f"{_OP}: head_sink must hold num_heads ({nh}) values")
        scale = f32(cfg.scale if cfg.scale else 1.0 / math.sqrt(d))
        common_tail = (f32(cfg.softcap), i32(cfg.window), i32(cfg.causal))
        if uses_decode(s):
            part = None
            if geo.nchunks > 1:
                part = xp.empty(b * nh * s * geo.nchunks * (d + 2), dtype=np.float32)
            fns["gqa_decode"](
                (geo.nchunks, nkv * geo.nrg, b),
                (BLOCK,),
                (qbuf, kc, vc, seqlens_k, qseq, bias, i64(bs[0]), i64(bs[1]), i64(bs[2]),
                 i64(bs[3]), sink, i32(cfg.smooth), part, y, i32(b), i32(s), i32(nh), i32(nkv),
                 i32(d), i32(cap), i32(kv_limit), i32(geo.chunk), i32(geo.nchunks),
                 i32(geo.rows), i32(geo.nrg), i32(geo.ktile), scale, *common_tail),
                shared_mem=geo.smem,
            )  # fmt: skip
            if part is not None:
                fns["gqa_reduce"](
                    (b * nh * s,),
                    (min(256, (d + 31) // 32 * 32),),
                    (part, y, seqlens_k, sink, i32(cfg.smooth), i32(b), i32(s), i32(nh), i32(d),
                     i32(kv_limit), i32(geo.chunk), i32(geo.nchunks)),
                )  # fmt: skip
        else:
            fns["gqa_prefill"](
                ((s + geo.bq - 1) // geo.bq, nh, b),
                (BLOCK,),
                (qbuf, kc, vc, seqlens_k, qseq, bias, i64(bs[0]), i64(bs[1]), i64(bs[2]),
                 i64(bs[3]), sink, i32(cfg.smooth), y, i32(s), i32(nh), i32(nkv), i32(d),
                 i32(cap), i32(kv_limit), i32(geo.bq), i32(geo.bk), scale, *common_tail),
                shared_mem=geo.smem,
            )  # fmt: skip
        return (y, kc, vc)

    return run
