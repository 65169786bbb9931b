"""ONNX Attention (opsets 23-25) on torch: grouped heads, masks, caches, windows, softcap.

float16 inputs are widened to float32 for the matmuls and the softmax, as
the ONNX function does; float64 stays float64.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from onnxep.errors import NotSupported
from onnxep.providers import NodeInfo, kernel

_TYPES = ["float", "float16", "double"]


def _grouped(a: torch.Tensor, b: torch.Tensor, hkv: int) -> torch.Tensor:
    """``a @ b`` where ``a`` has Hq heads and ``b`` Hkv; query head h reads kv head h // g."""
    bsz, hq, rows, inner = a.shape
    if hq == hkv:
        return torch.matmul(a, b)
    g = hq // hkv
    out = torch.matmul(a.reshape(bsz, hkv, g * rows, inner), b)
    return out.reshape(bsz, hq, rows, out.shape[-1])


def _split(x: torch.Tensor, heads: int) -> torch.Tensor:
    b, s, hd = x.shape
    return x.reshape(b, s, heads, hd // heads).transpose(1, 2)


def _additive(allowed: torch.Tensor, ct: torch.dtype) -> torch.Tensor:
    zero = torch.zeros((), dtype=ct, device=allowed.device)
    return torch.where(allowed, zero, torch.full((), -math.inf, dtype=ct, device=allowed.device))


def _softmax_rows(x: torch.Tensor) -> torch.Tensor:
    # A row that is entirely -inf gives zeros, not NaN.
    m = torch.amax(x, dim=-1, keepdim=True)
    m = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
    e = torch.exp(x - m)
    s = e.sum(dim=-1, keepdim=True)
    return e / torch.where(s == 0, torch.ones_like(s), s)


@kernel("Attention", since=23, dtypes={0: _TYPES, 1: _TYPES, 2: _TYPES})
def attention(node: NodeInfo, xp: Any):
    is_causal = bool(node.attr("is_causal", 0))
    q_heads = node.attr("q_num_heads", None)
    kv_heads = node.attr("kv_num_heads", None)
    scale_attr = node.attr("scale", None)
    cap = float(node.attr("softcap", 0.0))
    mode = int(node.attr("qk_matmul_output_mode", 0))
    sm_prec = node.attr("softmax_precision", None)
    left = int(node.attr("left_window_size", -1)) if node.opset >= 25 else -1
    right = int(node.attr("right_window_size", -1)) if node.opset >= 25 else -1
    if mode not in (0, 1, 2, 3):
        raise NotSupported(f"Attention: qk_matmul_output_mode={mode} is not 0..3")
    in_dt = node.input_dtype(0)
    ct = torch.float64 if (in_dt is not None and in_dt.itemsize == 8) else torch.float32
    if sm_prec is not None and int(sm_prec) == 11:  # TensorProto.DOUBLE
        ct = torch.float64
    want_qk = node.has_output(3)

    def run(q, k, v, mask=None, past_k=None, past_v=None, nonpad=None):
        out_dt = q.dtype
        rank3 = q.ndim == 3
        if rank3:
            if q_heads is None or kv_heads is None:
                raise ValueError("Attention: 3-D inputs need q_num_heads and kv_num_heads")
            q4, k4, v4 = _split(q, q_heads), _split(k, kv_heads), _split(v, kv_heads)
        else:
            q4, k4, v4 = q, k, v
        if past_k is not None:
            k4 = torch.cat((past_k, k4.to(past_k.dtype)), dim=2)
            v4 = torch.cat((past_v, v4.to(past_v.dtype)), dim=2)
        present_k, present_v = k4, v4
        b, _, lq, d = q4.shape
        s = k4.shape[2]
        hkv = k4.shape[1]
        scale = scale_attr if scale_attr is not None else 1.0 / math.sqrt(d)
        scores = _grouped(q4.to(ct), k4.to(ct).transpose(-1, -2), hkv) * scale
        raw = scores
        if cap > 0:
            scores = torch.tanh(scores / cap) * cap
        capped = scores
        bias = _bias(mask, past_k, nonpad, lq, s, b, ct, is_causal, left, right, q.device)
        if bias is not None:
            scores = scores + bias
        probs = _softmax_rows(scores)
        if bias is not None:
            dead = torch.amax(bias, dim=-1, keepdim=True)
            dead = torch.isinf(dead) & (dead < 0)
            probs = torch.where(dead, torch.zeros((), dtype=ct, device=q.device), probs)
        y = _grouped(probs, v4.to(ct), hkv).to(out_dt)
        if rank3:
            y = y.transpose(1, 2).reshape(b, lq, -1)
        qk = None
        if want_qk:
            qk = (raw, capped, scores, probs)[mode]
            if qk.ndim == 4 and qk.shape[1] != q4.shape[1]:
                qk = torch.broadcast_to(qk, (b, q4.shape[1], lq, s))
            qk = qk.to(out_dt)
        return (y, present_k, present_v, qk)

    return run


def _bias(mask, past_k, nonpad, lq, s, b, ct, is_causal, left, right, device):
    """The additive bias (0 / -inf / float mask) broadcastable to (B, H, L, S), or None."""
    bias = None
    if mask is not None:
        m = _additive(mask, ct) if mask.dtype == torch.bool else mask.to(ct)
        pad = s - m.shape[-1]
        if pad > 0:
            fill = torch.full((*m.shape[:-1], pad), -math.inf, dtype=ct, device=device)
            m = torch.cat((m, fill), dim=-1)
        bias = m
    if is_causal or left >= 0 or right >= 0:
        i = torch.arange(lq, device=device).reshape(lq, 1)
        j = torch.arange(s, device=device).reshape(1, s)
        if past_k is not None:
            pos = i + past_k.shape[2]
        elif nonpad is not None:
            pos = i + (nonpad.to(torch.int64).reshape(-1, 1, 1, 1) - lq)
        else:
            pos = i
        allowed = None
        if is_causal:
            allowed = j <= pos
        if left >= 0:
            w = pos - j <= left
            allowed = w if allowed is None else allowed & w
        if right >= 0:
            w = j - pos <= right
            allowed = w if allowed is None else allowed & w
        a = _additive(allowed, ct)
        bias = a if bias is None else bias + a
    if nonpad is not None:
        keep = torch.arange(s, device=device).reshape(1, s) < nonpad.to(torch.int64).reshape(-1, 1)
        a = _additive(keep, ct).reshape(b, 1, 1, s)
        bias = a if bias is None else bias + a
    return bias
