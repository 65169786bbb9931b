"""GroupQueryAttention on NumPy, with a fast path for the common decode and prefill.

When every batch row has the same length and the present cache is the past
plus the new rows (not a fixed-capacity shared buffer) -- the way
onnxruntime-genai drives CPU models -- the cache is one concatenation and the
mask at most a causal triangle, so a step costs a dozen NumPy calls instead of
the general kernel's indexed gathers. On the host, reading ``seqlens_k`` to
decide is free; everything else goes to the generic kernel.

Fixed-capacity past buffers (``onnxep.generate``'s shared-buffer path, as
onnxruntime-genai's ``past_present_share_buffer``) take these paths too: the new rows land
after the filled ones in the buffers themselves when IO binding gave both up for the run
(``may_overwrite``: each bound as its past and its present), else in copies, as the
generic kernel writes them; the rows after them are never read.
"""

from __future__ import annotations

import numpy as np

from onnxep.providers.inplace import may_overwrite
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.attention import default_scale, rotate, split_qkv
from onnxep.providers.ops.op_group_query_attention import group_query_attention as generic

from .. import jit
from . import gqa_decode_jit


@kernel(
    "GroupQueryAttention",
    since=1,
    domain="com.microsoft",
    dtypes={0: ("float", "float16", "bfloat16")},
    host_inputs=(6,),
    inplace=((3, 1), (4, 2)),
)
def group_query_attention(node: NodeInfo, xp):
    general = generic(node, xp)
    nh = int(node.attr("num_heads"))
    nkv = int(node.attr("kv_num_heads"))
    plain = (
        float(node.attr("softcap", 0.0)) == 0.0
        and int(node.attr("local_window_size", -1)) < 0
        and bool(node.attr("causal", 1))
        and not node.attr("smooth_softmax", 0)
        and not node.has_output(3)
        and not any(node.has_input(i) for i in (9, 10, 11))  # position_ids, bias, head_sink
        and node.num_inputs <= 12
    )
    if not plain:
        return general
    scale_attr = float(node.attr("scale", 0.0))
    do_rotary = bool(node.attr("do_rotary", 0))
    interleaved = bool(node.attr("rotary_interleaved", 0))
    group = nh // nkv
    compiled = jit.ENABLED
    name = node.name

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
        *rest,
    ):
        b, s, _ = query.shape
        lens = np.asarray(seqlens_k).reshape(-1)
        t = int(lens[0]) + 1
        p = t - s
        total = int(np.asarray(total_len).reshape(-1)[0])
        past_len = 0 if past_k is None else past_k.shape[2]
        # fixed-capacity buffers holding p rows (the present is the buffer, new rows at p)
        buffers = past_len > p and max(total, t) <= past_len and past_v is not None
        if (
            query.dtype != np.float32
            or p < 0
            or (not buffers and (total != t or past_len != p))
            or (buffers and past_v.shape != past_k.shape)
            or (lens.size > 1 and (lens != lens[0]).any())
            or (do_rotary and p + s > cos.shape[0])  # the general kernel names the position
        ):
            return general(query, key, value, past_k, past_v, seqlens_k, total_len, cos, sin, *rest)
        if s == 1 and compiled:
            rows = _head_rows(query, key, value, past_k, past_v, nh, nkv)
            if rows is not None and do_rotary and not _rotary_ok(cos, sin, rows[0].shape[2]):
                rows = None
            if rows is not None:
                hd = rows[0].shape[-1]
                y, present_k, present_v = gqa_decode_jit.token(
                    *rows,
                    past_k,
                    past_v,
                    cos[p] if do_rotary else None,
                    sin[p] if do_rotary else None,
                    interleaved,
                    scale_attr if scale_attr else default_scale(hd),
                    filled=p if buffers else None,
                    in_place=buffers and _given_up(past_k, past_v),
                )
                return (y, present_k, present_v, None)
        if buffers:
            buf_k, buf_v = past_k, past_v
            past_k, past_v = past_k[:, :, :p], past_v[:, :, :p]
        q, k, v = split_qkv(np, query, key, value, nh, nkv)
        hd = q.shape[-1]
        if do_rotary:
            c = cos[p : p + s][None, None]
            sn = sin[p : p + s][None, None]
            rot = 2 * cos.shape[-1]
            q = rotate(np, q, c, sn, interleaved, rot)
            k = rotate(np, k, c, sn, interleaved, rot)
        present_k = k if past_k is None else np.concatenate((past_k, k), axis=2)
        present_v = v if past_v is None else np.concatenate((past_v, v), axis=2)
        scale = scale_attr if scale_attr else default_scale(hd)
        # Query heads of one KV head side by side: (B, Hkv, G*S, D) @ (B, Hkv, D, T).
        qg = (q * np.float32(scale)).reshape(b, nkv, group * s, hd)
        scores = np.matmul(qg, present_k.transpose(0, 1, 3, 2))
        if s > 1:
            rows = np.arange(s)[:, None] + p
            masked = np.arange(t)[None, :] > rows  # (S, T)
            scores = scores.reshape(b, nkv, group, s, t)
            scores[..., masked] = -np.inf
            scores = scores.reshape(b, nkv, group * s, t)
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        ctx = np.matmul(scores, present_v).reshape(b, nh, s, hd)
        y = ctx.transpose(0, 2, 1, 3).reshape(b, s, nh * hd)
        if buffers:
            in_place = _given_up(buf_k, buf_v)
            present_k = _written(buf_k, present_k, p, in_place)
            present_v = _written(buf_v, present_v, p, in_place)
        return (y, present_k, present_v, None)

    def _given_up(past_k, past_v) -> bool:
        return may_overwrite(name, past_k) and may_overwrite(name, past_v)

    return run


_F32 = np.dtype(np.float32)


def _written(buf: np.ndarray, grown: np.ndarray, p: int, in_place: bool) -> np.ndarray:
    """The fixed-capacity ``buf`` with the rows of ``grown`` from ``p`` on written at ``p``:
    into ``buf`` itself when the caller gave it up, else into a copy (as the generic kernel
    scatters them; rows after them keep what ``buf`` held)."""
    out = buf if in_place else buf.copy()
    out[:, :, p : grown.shape[2]] = grown[:, :, p:]
    return out


def _head_rows(query, key, value, past_k, past_v, nh, nkv):
    """One token's q (B, nh, D), k and v (B, nkv, D) as views of the packed or separate
    inputs, when everything is float32 and the caches have the new rows' heads and size;
    else None."""
    b = query.shape[0]
    if key is None:
        width = query.shape[2] // (nh + 2 * nkv)
        qkv = query.reshape(b, nh + 2 * nkv, width)
        q, k, v = qkv[:, :nh], qkv[:, nh : nh + nkv], qkv[:, nh + nkv :]
    else:
        q = query.reshape(b, nh, -1)
        k = key.reshape(b, nkv, -1)
        v = value.reshape(b, nkv, -1)
    d = q.shape[2]
    if k.shape[2] != d or v.shape[2] != d or query.dtype != _F32 or k.dtype != _F32:
        return None
    if v.dtype != _F32:
        return None
    if past_k is not None:
        if past_v is None or past_k.dtype != _F32 or past_v.dtype != _F32:
            return None
        if past_k.shape != past_v.shape or past_k.shape[1] != nkv or past_k.shape[3] != d:
            return None
    elif past_v is not None:
        return None
    return q, k, v


def _rotary_ok(cos, sin, d: int) -> bool:
    """float32 cos/sin tables whose rotated width fits a head."""
    return (
        cos.ndim == 2
        and sin.shape == cos.shape
        and cos.dtype == _F32
        and sin.dtype == _F32
        and 2 * cos.shape[1] <= d
    )
