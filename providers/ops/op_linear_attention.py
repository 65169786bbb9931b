"""com.microsoft LinearAttention: recurrent linear attention with a (d_k, d_v) state per KV head.

update_rule (S is the state, k/v/q one token's vectors, g the log-space decay,
b the update rate):
  linear:      S = S + k v^T
  gated:       S = exp(g) S + k v^T
  delta:       S = S + b k (v - S^T k)^T
  gated_delta: S = exp(g) S + b k (v - exp(g) S^T k)^T
and o = scale * S^T q. Query, key and value are packed (B, T, heads * dim).
Heads: q heads share a KV state in groups (GQA); with fewer q than KV heads,
each q head serves a group of KV heads (inverse GQA); key may carry fewer
heads than value, each shared by a group of KV heads. The decay is per head
(B, T, H_kv) or per key dimension (B, T, H_kv * d_k); beta is (B, T, H_kv)
or (B, T, 1). state_window W > 0 keeps the states after the last W tokens.

The recurrence runs token by token (T is the small loop axis), vectorized
over batch and heads, in float32.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import _contrib as C

_RULES = ("linear", "gated", "delta", "gated_delta")


@kernel("LinearAttention", domain="com.microsoft", dtypes=("float", "float16", "bfloat16"))
def linear_attention(node: NodeInfo, xp: Any):
    op = "LinearAttention"
    hq = int(node.attr("q_num_heads"))
    hkv = int(node.attr("kv_num_heads"))
    if hq <= 0 or hkv <= 0:
        raise NotSupported(f"{op}: q_num_heads and kv_num_heads must be positive")
    if max(hq, hkv) % min(hq, hkv):
        raise NotSupported(f"{op}: q_num_heads={hq} and kv_num_heads={hkv} must divide one another")
    rule = node.attr("update_rule", "gated_delta")
    rule = rule.decode() if isinstance(rule, bytes) else str(rule)
    if rule not in _RULES:
        raise NotSupported(f"{op}: update_rule {rule!r} is not one of {', '.join(_RULES)}")
    scale_attr = float(node.attr("scale", 0.0))
    window = int(node.attr("state_window", 0))
    if window < 0:
        raise NotSupported(f"{op}: state_window must be >= 0, got {window}")
    gated = rule in ("gated", "gated_delta")
    delta = rule in ("delta", "gated_delta")

    def run(query, key, value, past_state=None, decay=None, beta=None):
        bsz, seq, qh = query.shape
        dk = qh // hq
        if dk * hq != qh:
            raise ValueError(f"{op}: query hidden {qh} is not a multiple of q_num_heads {hq}")
        nk = key.shape[2] // dk
        dv = value.shape[2] // hkv
        if nk * dk != key.shape[2] or dv * hkv != value.shape[2] or hkv % nk:
            raise ValueError(f"{op}: key/value hidden sizes do not fit the head counts")
        if gated and decay is None:
            raise ValueError(f"{op}: decay is required for update_rule={rule}")
        if delta and beta is None:
            raise ValueError(f"{op}: beta is required for update_rule={rule}")
        scale = scale_attr if scale_attr != 0.0 else 1.0 / math.sqrt(dk)
        f32 = np.float32

        q = C.up(query, xp, f32).reshape(bsz, seq, hq, dk)
        k = C.up(key, xp, f32).reshape(bsz, seq, nk, dk)
        if nk != hkv:
            k = xp.repeat(k, hkv // nk, axis=2)
        v = C.up(value, xp, f32).reshape(bsz, seq, hkv, dv)
        if hq >= hkv:
            group = hq // hkv
            q = q.reshape(bsz, seq, hkv, group, dk)
        else:
            group = 1
            q = xp.repeat(q, hkv // hq, axis=2).reshape(bsz, seq, hkv, 1, dk)
        g = None
        if gated:
            g = C.up(decay, xp, f32)
            if g.shape[2] == hkv * dk:
                g = xp.exp(g.reshape(bsz, seq, hkv, dk, 1))
            elif g.shape[2] == hkv:
                g = xp.exp(g.reshape(bsz, seq, hkv, 1, 1))
            else:
                raise ValueError(f"{op}: decay last dim must be H_kv or H_kv*d_k")
        bt = None
        if delta:
            bt = C.up(beta, xp, f32)
            if bt.shape[2] not in (hkv, 1):
                raise ValueError(f"{op}: beta last dim must be H_kv or 1")
            bt = bt.reshape(bsz, seq, -1, 1)

        if past_state is None:
            s = xp.zeros((bsz, hkv, dk, dv), dtype=f32)
        else:
            ps = past_state[window - 1] if window > 0 else past_state
            s = C.up(ps, xp, f32).reshape(bsz, hkv, dk, dv)

        outs = []
        kept = []
        first_kept = seq - window
        for t in range(seq):
            kt = k[:, t]  # (B, H, dk)
            if g is not None:
                s = s * g[:, t]
            if delta:
                retrieved = xp.matmul(kt[:, :, None, :], s)[:, :, 0, :]  # S^T k: (B, H, dv)
                upd = bt[:, t] * (v[:, t] - retrieved)
            else:
                upd = v[:, t]
            s = s + kt[:, :, :, None] * upd[:, :, None, :]
            outs.append(xp.matmul(q[:, t], s))  # (B, H, group, dv)
            if window > 0 and t >= first_kept:
                kept.append(s)

        out_heads = hkv * group
        if seq:
            o = xp.stack(outs, axis=1) * scale
        else:
            o = xp.zeros((bsz, 0, hkv, group, dv), dtype=f32)
        o = C.down(o.reshape(bsz, seq, out_heads * dv), query.dtype)

        sdt = C.out_dtype(node, 1, past_state.dtype if past_state is not None else query.dtype)
        if window > 0:
            missing = window - len(kept)
            zeros = [xp.zeros((bsz, hkv, dk, dv), dtype=f32)] * missing
            present = xp.stack(zeros + kept)
        else:
            present = s
        return C.pad_outputs(node, {0: o, 1: C.down(present, sdt)})

    return run
