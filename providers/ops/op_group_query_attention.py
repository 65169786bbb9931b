"""com.microsoft GroupQueryAttention: GQA over a BNSH KV cache addressed by seqlens_k.

Per batch entry ``b``: ``T = seqlens_k[b] + 1`` tokens are valid after this
step, ``Q = min(S, T)`` of them (or ``query_seqlens[b]``) are the new rows, so
``P = T - Q`` were cached before. New K/V rows land at cache rows ``[P, T)``;
query row ``s`` sits at absolute position ``P + s`` (used by the causal mask,
the local window and rotary). Every other cache row keeps what the past
buffer held (zeros where the cache grows), exactly what an in-place write into
a shared buffer leaves; rows at or past ``T`` are never read. This covers both
the growing cache (present = past + new) and the fixed-capacity cache whose
present shares the past buffer: everything is indexed by ``seqlens_k`` on the
device. The only host read is ``total_sequence_length``, which sizes the
present cache (``max(total, past capacity)``) and the key range attended.
"""

from __future__ import annotations

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.bounds import (
    check_kv_lengths,
    check_positions,
    check_query_lengths,
    first_id_where,
    position_ids_where,
    token_where,
)
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.attention import (
    compute_dtype,
    default_scale,
    grouped_context,
    grouped_scores,
    merge_heads,
    rotate,
    softcap,
    split_qkv,
    widen,
)

_UNSUPPORTED_INPUTS = {12: "k_scale", 13: "v_scale", 14: "q_norm_weight", 15: "k_norm_weight"}


@kernel(
    "GroupQueryAttention",
    since=1,
    domain="com.microsoft",
    dtypes={0: ("float", "float16", "bfloat16")},
    host_inputs=(6,),
)
def group_query_attention(node: NodeInfo, xp):
    nh = int(node.attr("num_heads"))
    nkv = int(node.attr("kv_num_heads"))
    if nh <= 0 or nkv <= 0 or nh % nkv:
        raise NotSupported(
            f"GroupQueryAttention: num_heads {nh} must be a positive multiple of kv_num_heads {nkv}"
        )
    scale_attr = float(node.attr("scale", 0.0))
    cap = float(node.attr("softcap", 0.0))
    window = int(node.attr("local_window_size", -1))
    causal = bool(node.attr("causal", 1))
    do_rotary = bool(node.attr("do_rotary", 0))
    interleaved = bool(node.attr("rotary_interleaved", 0))
    smooth = bool(node.attr("smooth_softmax", 0))
    qk_mode = int(node.attr("qk_output", 0))
    if node.attr("sliding_window_cache", 0):
        raise NotSupported("GroupQueryAttention: sliding_window_cache=1 is not supported")
    for i, name in _UNSUPPORTED_INPUTS.items():
        if node.has_input(i):
            raise NotSupported(
                f"GroupQueryAttention: input {name} (quantized cache / QK norm) is not supported"
            )
    for attr in ("k_quant_type", "v_quant_type"):
        q = node.attr(attr, "NONE")
        if (q.decode() if isinstance(q, bytes) else q) != "NONE":
            raise NotSupported(f"GroupQueryAttention: {attr} (quantized KV cache) is not supported")
    if qk_mode not in (0, 1, 2):
        raise NotSupported(f"GroupQueryAttention: qk_output={qk_mode} is not 0, 1 or 2")
    if node.has_output(3) and qk_mode == 0:
        raise NotSupported("GroupQueryAttention: output_qk is wired but qk_output is 0")

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
        *_rest,
    ):
        query_seqlens = _rest[4] if len(_rest) > 4 else None
        ct = compute_dtype(query.dtype)
        b, s, _ = query.shape
        q, k, v = split_qkv(xp, query, key, value, nh, nkv)
        hd = q.shape[-1]
        total = int(np.asarray(total_len).reshape(-1)[0])

        cap_len = total if past_k is None else max(total, past_k.shape[2])
        # T tokens are attended, as onnxruntime does (total_sequence_length only sizes the
        # present cache); they must fit it, and the bias' key columns when it has them
        bias_cols = None if attn_bias is None else int(attn_bias.shape[-1])
        limit = cap_len if bias_cols in (None, 1) else min(cap_len, bias_cols)
        check_kv_lengths(xp, seqlens_k, limit, cap_len)
        kv_n = cap_len
        if type(seqlens_k) is np.ndarray and seqlens_k.size:  # on the host: read the longest
            kv_n = min(cap_len, max(total, int(seqlens_k.max()) + 1))
        tlen = xp.reshape(seqlens_k.astype(xp.int64), (b, 1)) + 1  # T per batch
        if query_seqlens is not None:
            check_query_lengths(xp, query_seqlens, tlen, s)
            qlen = xp.reshape(query_seqlens.astype(xp.int64), (b, 1))
        else:
            qlen = xp.minimum(tlen, s)
        plen = tlen - qlen  # P per batch, (B, 1)
        pos = plen + xp.reshape(xp.arange(s), (1, s))  # absolute query positions (B, S)

        if do_rotary:
            rows = cos.shape[0]
            if position_ids is not None and s > 1 and s == total and query_seqlens is None:
                # onnxruntime reads only the first id on a first prompt
                first = xp.reshape(position_ids.astype(xp.int64), (-1,))[:1]
                rpos = xp.broadcast_to(first + xp.reshape(xp.arange(s), (1, s)), (b, s))
                where = first_id_where
            elif position_ids is not None:
                rpos = position_ids.astype(xp.int64)
                where = position_ids_where
            else:
                rpos, where = pos, token_where
            # only a batch row's real tokens count: padded query rows' results are not used
            real = xp.reshape(xp.arange(s), (1, s)) < qlen
            check_positions(xp, rpos, rows, where, real)
            rpos = xp.reshape(xp.clip(rpos, 0, rows - 1), (-1,))
            c = widen(xp.take(cos, rpos, axis=0), ct)
            sn = widen(xp.take(sin, rpos, axis=0), ct)
            c = xp.reshape(c, (b, 1, s, c.shape[-1]))
            sn = xp.reshape(sn, (b, 1, s, sn.shape[-1]))
            rot = 2 * cos.shape[-1]
            q = rotate(xp, widen(q, ct), c, sn, interleaved, rot).astype(query.dtype)
            k = rotate(xp, widen(k, ct), c, sn, interleaved, rot).astype(query.dtype)

        present_k = _scatter_cache(xp, past_k, k, plen, tlen, cap_len)
        present_v = _scatter_cache(xp, past_v, v, plen, tlen, cap_len)

        kk = widen(present_k[:, :, :kv_n], ct)
        vv = widen(present_v[:, :, :kv_n], ct)
        scale = scale_attr if scale_attr else default_scale(hd)
        scores = grouped_scores(xp, widen(q, ct), kk) * ct.type(scale)
        scores = softcap(xp, scores, cap)
        if attn_bias is not None:
            scores = scores + _key_columns(xp, widen(attn_bias, ct), kv_n)
        raw = scores

        j = xp.reshape(xp.arange(kv_n), (1, 1, 1, kv_n))
        p4 = xp.reshape(pos, (b, 1, s, 1))
        allowed = j < xp.reshape(tlen, (b, 1, 1, 1))
        if causal:
            allowed = allowed & (j <= p4)
        if window >= 0:
            allowed = allowed & (p4 - j < window)
        scores = xp.where(allowed, scores, xp.asarray(float("-inf"), dtype=ct))

        if head_sink is not None or smooth:
            if head_sink is not None:
                sink = xp.reshape(widen(head_sink, ct), (1, nh, 1, 1))
            else:
                sink = xp.zeros((1, 1, 1, 1), dtype=ct)
            m = xp.maximum(xp.max(scores, axis=-1, keepdims=True), sink)
            e = xp.exp(scores - m)
            probs = e / (xp.sum(e, axis=-1, keepdims=True) + xp.exp(sink - m))
        else:
            m = xp.max(scores, axis=-1, keepdims=True)
            m = xp.where(xp.isinf(m), xp.zeros_like(m), m)
            e = xp.exp(scores - m)
            den = xp.sum(e, axis=-1, keepdims=True)
            probs = e / xp.where(den == 0, xp.ones_like(den), den)
        y = merge_heads(xp, grouped_context(xp, probs, vv)).astype(query.dtype)
        qk = None
        if node.has_output(3):
            # mode 1: scaled QK after softcap and attention_bias, zero where a key is not attended
            qk = probs if qk_mode == 2 else xp.where(allowed, raw, xp.zeros((), dtype=ct))
            qk = qk[..., :total].astype(query.dtype)
        return (y, present_k, present_v, qk)

    return run


def _key_columns(xp, bias, n: int):
    """``bias`` with ``n`` key columns: cut, or padded with zeros for keys past its columns
    that no row attends (the bounds check keeps every attended key within them)."""
    cols = bias.shape[-1]
    if cols == 1 or cols == n:
        return bias
    if cols > n:
        return bias[..., :n]
    pad = xp.zeros((*bias.shape[:-1], n - cols), dtype=bias.dtype)
    return xp.concatenate((bias, pad), axis=-1)


def _scatter_cache(xp, past, new, plen, tlen, cap_len):
    """Cache of ``cap_len`` rows: the past buffer (zero-padded) with new rows written at [P, T).

    A gather (one index per cache row) instead of a scatter keeps this a pure
    array expression with per-batch offsets that stay on the device.
    """
    b, h, s, d = new.shape
    t = xp.reshape(xp.arange(cap_len), (1, cap_len))
    src = xp.clip(t - plen, 0, s - 1)  # (B, C) row of `new` each cache row would take
    # the index broadcasts over heads and channels (NumPy and CuPy both allow it)
    from_new = xp.take_along_axis(new, xp.reshape(src, (b, 1, cap_len, 1)), axis=2)
    use_new = xp.reshape((t >= plen) & (t < tlen), (b, 1, cap_len, 1))
    if past is not None:
        pl = past.shape[2]
        if pl < cap_len:
            pad = xp.zeros((b, h, cap_len - pl, d), dtype=past.dtype)
            base = xp.concatenate((past, pad), axis=2)
        else:
            base = past[:, :, :cap_len]
    else:
        base = xp.zeros((b, h, cap_len, d), dtype=new.dtype)
    return xp.where(use_new, from_new.astype(base.dtype), base)
