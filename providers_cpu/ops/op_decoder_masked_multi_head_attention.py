"""com.microsoft DecoderMaskedMultiHeadAttention: one decoding step of multi-head attention.

Self attention: ``query``, ``key``, ``value`` are the step's (B, 1, hidden) projections (or a
packed (B, 1, 2 * hidden + v_hidden) query with no key and value), ``bias`` is added to
them, and the step's key and value join ``past_key``/``past_value`` (B, N, P, H) in
``present_key``/``present_value``. With ``past_present_share_buffer`` the past tensors are
(B, N, max, H) buffers, ``past_sequence_length`` says how many entries are filled, the step
is written at that position and the presents are the buffers with it. Cross attention:
``key``/``value`` are already (B, N, L, H), no presents. ``mask_index`` (B, total) zeros
get ``mask_filter_value``, ``attention_bias`` is added to the scores, ``qk`` (with
``output_qk``) is the scaled scores before the softmax.

Beam search (``beam_width`` above 1 with ``cache_indirection``) reads each past position
from the beam the indirection names.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument
from onnxep.providers.kernel import kernel
from onnxep.providers.ops._attention import default_scale, softmax_rows


def _heads(x: np.ndarray, n: int) -> np.ndarray:
    b, s, hid = x.shape
    return x.reshape(b, s, n, hid // n).transpose(0, 2, 1, 3)


@kernel(
    "DecoderMaskedMultiHeadAttention",
    since=1,
    domain="com.microsoft",
    dtypes={0: ("float", "float16")},
)
def decoder_masked_multi_head_attention(node: Any, xp: Any):
    op = node.op_type
    nh = int(node.attr("num_heads"))
    scale_attr = float(node.attr("scale", 0.0) or 0.0)
    filt = np.float32(node.attr("mask_filter_value", -10000.0))
    share = bool(node.attr("past_present_share_buffer", 0))
    want_qk = bool(node.attr("output_qk", 0))

    def run(
        query,
        key=None,
        value=None,
        mask=None,
        attn_bias=None,
        past_key=None,
        past_value=None,
        past_len=None,
        beam_width=None,
        indirection=None,
        bias=None,
    ):
        dt = query.dtype
        q = query.astype(np.float32)
        if q.ndim != 3 or q.shape[1] != 1:
            raise InvalidArgument(f"{op}: query must be (batch, 1, hidden), got {query.shape}")
        b = q.shape[0]
        cross = key is not None and key.ndim == 4
        if key is None and value is None:
            # packed QKV (with value as wide as query and key)
            if bias is not None:
                q = q + bias.astype(np.float32)
            third = q.shape[2] // 3
            q, k, v = q[..., :third], q[..., third : 2 * third], q[..., 2 * third :]
        elif cross:
            k, v = key.astype(np.float32), value.astype(np.float32)
            if bias is not None:
                q = q + bias.astype(np.float32)[: q.shape[2]]
        else:
            k, v = key.astype(np.float32), value.astype(np.float32)
            if bias is not None:
                bb = bias.astype(np.float32)
                hq, hk = q.shape[2], k.shape[2]
                q, k, v = q + bb[:hq], k + bb[hq : hq + hk], v + bb[hq + hk :]
        qh = _heads(q, nh)
        head = qh.shape[-1]
        present_k = present_v = None
        if cross:
            kh, vh = k, v
        else:
            kn, vn = _heads(k, nh), _heads(v, nh)
            if share:
                if past_key is None or past_len is None:
                    raise InvalidArgument(
                        f"{op}: past_present_share_buffer needs past_key, past_value and "
                        "past_sequence_length"
                    )
                p = int(np.asarray(past_len).reshape(-1)[0])
                cap = past_key.shape[2]
                if not 0 <= p < cap:
                    raise InvalidArgument(
                        f"{op}: past_sequence_length {p} outside the buffer of {cap}"
                    )
                present_k = past_key.astype(np.float32, copy=True)
                present_v = past_value.astype(np.float32, copy=True)
                present_k[:, :, p] = kn[:, :, 0]
                present_v[:, :, p] = vn[:, :, 0]
                kh, vh = present_k[:, :, : p + 1], present_v[:, :, : p + 1]
            else:
                if past_key is not None:
                    kh = np.concatenate([past_key.astype(np.float32), kn], axis=2)
                    vh = np.concatenate([past_value.astype(np.float32), vn], axis=2)
                else:
                    kh, vh = kn, vn
                present_k, present_v = kh, vh
        beams = 1 if beam_width is None else int(np.asarray(beam_width).reshape(-1)[0])
        if beams > 1 and indirection is not None and not cross:
            kh, vh = _reorder_beams(kh, vh, indirection, beams, op)
        scale = scale_attr or default_scale(head)
        scores = np.matmul(qh, np.swapaxes(kh, -1, -2)) * np.float32(scale)  # (B, N, 1, T)
        total = scores.shape[-1]
        if mask is not None:
            m = mask.reshape(b, -1)[:, -total:] if mask.shape[-1] >= total else mask.reshape(b, -1)
            scores = scores + np.where(m > 0, np.float32(0), filt)[:, None, None, :]
        if attn_bias is not None:
            scores = scores + attn_bias.astype(np.float32)[..., :total]
        probs = softmax_rows(np, scores)
        y = np.matmul(probs, vh).transpose(0, 2, 1, 3).reshape(b, 1, -1).astype(dt)
        outs = [y]
        outs.append(None if present_k is None or not node.has_output(1) else present_k.astype(dt))
        outs.append(None if present_v is None or not node.has_output(2) else present_v.astype(dt))
        outs.append(scores.astype(dt) if want_qk and node.has_output(3) else None)
        return tuple(outs)

    return run


def _reorder_beams(k, v, indirection, beams, op):
    """Each batch row's past positions read from the beam ``cache_indirection`` names."""
    bb, n, t, h = k.shape
    ind = np.asarray(indirection).astype(np.int64)
    if ind.ndim != 3 or ind.shape[0] * ind.shape[1] != bb:
        raise InvalidArgument(
            f"{op}: cache_indirection must be (batch, beam_width, max_length), got {ind.shape}"
        )
    batch = bb // beams
    src = np.arange(bb).reshape(batch, beams)
    out_k, out_v = k.copy(), v.copy()
    # the step's own key (last position) stays this beam's
    for pos in range(t - 1):
        beam = ind[:, :, pos]  # (batch, beams)
        if beam.min() < 0 or beam.max() >= beams:
            raise InvalidArgument(f"{op}: cache_indirection names a beam outside 0..{beams - 1}")
        rows = (src[:, :1] + beam).reshape(-1)
        out_k[:, :, pos] = k[rows, :, pos]
        out_v[:, :, pos] = v[rows, :, pos]
    return out_k, out_v
