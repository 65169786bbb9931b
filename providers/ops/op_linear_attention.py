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

Everything is float32. Prefill runs chunk-parallel (chunk_size tokens per
step, see _chunk); decode steps and the tokens a state window keeps run the
recurrence one token at a time, vectorized over batch and heads.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import contrib as C

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
    chunk = max(int(node.attr("chunk_size", 64)), 1)

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

        # Head-major float32 views: q (B, H, G, T, dk), k (B, H, T, dk), v (B, H, T, dv).
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
        q = xp.transpose(q, (0, 2, 3, 1, 4))
        k = xp.transpose(k, (0, 2, 1, 3))
        v = xp.transpose(v, (0, 2, 1, 3))
        g = None  # log-space decay (B, H, T, dk or 1)
        if gated:
            g = C.up(decay, xp, f32)
            if g.shape[2] not in (hkv * dk, hkv):
                raise ValueError(f"{op}: decay last dim must be H_kv or H_kv*d_k")
            g = xp.transpose(g.reshape(bsz, seq, hkv, -1), (0, 2, 1, 3))
        bt = None  # update rate (B, H or 1, T)
        if delta:
            bt = C.up(beta, xp, f32)
            if bt.shape[2] not in (hkv, 1):
                raise ValueError(f"{op}: beta last dim must be H_kv or 1")
            bt = xp.transpose(bt, (0, 2, 1))

        if past_state is None:
            s = xp.zeros((bsz, hkv, dk, dv), dtype=f32)
        else:
            ps = past_state[window - 1] if window > 0 else past_state
            s = C.up(ps, xp, f32).reshape(bsz, hkv, dk, dv)

        # Prefill runs in chunks (matrix products over up to `chunk` tokens at once);
        # the tokens whose states the window keeps, and decode steps, run one by one.
        split = max(seq - window, 0) if seq > 1 else 0
        outs = []
        for c0 in range(0, split, chunk):
            c1 = min(c0 + chunk, split)
            sl = slice(c0, c1)
            o, s = _chunk(
                xp,
                s,
                q[:, :, :, sl],
                k[:, :, sl],
                v[:, :, sl],
                None if g is None else g[:, :, sl],
                None if bt is None else bt[:, :, sl],
            )
            outs.append(o)
        kept = []
        for t in range(split, seq):
            s, o = _step(
                xp,
                s,
                q[:, :, :, t],
                k[:, :, t],
                v[:, :, t],
                None if g is None else g[:, :, t],
                None if bt is None else bt[:, :, t],
            )
            outs.append(o[:, :, :, None])
            if window > 0 and t >= seq - window:
                kept.append(s)

        if outs:
            o = xp.concatenate(outs, axis=3) * scale  # (B, H, G, T, dv)
        else:
            o = xp.zeros((bsz, hkv, group, 0, dv), dtype=f32)
        o = xp.transpose(o, (0, 3, 1, 2, 4)).reshape(bsz, seq, hkv * group * dv)
        o = C.down(o, query.dtype)

        sdt = C.out_dtype(node, 1, past_state.dtype if past_state is not None else query.dtype)
        if window > 0:
            missing = window - len(kept)
            zeros = [xp.zeros((bsz, hkv, dk, dv), dtype=f32)] * missing
            present = xp.stack(zeros + kept)
        else:
            present = s
        return C.pad_outputs(node, {0: o, 1: C.down(present, sdt)})

    return run


def _step(xp: Any, s: Any, q: Any, k: Any, v: Any, g: Any, b: Any) -> tuple[Any, Any]:
    """One token: the new state and the unscaled readout (B, H, G, dv)."""
    if g is not None:
        s = s * xp.exp(g)[:, :, :, None]
    if b is not None:
        retrieved = xp.matmul(k[:, :, None, :], s)[:, :, 0, :]  # S^T k
        upd = b[:, :, None] * (v - retrieved)
    else:
        upd = v
    s = s + k[:, :, :, None] * upd[:, :, None, :]
    return s, xp.matmul(q, s)


def _chunk(xp: Any, s0: Any, q: Any, k: Any, v: Any, g: Any, b: Any) -> tuple[Any, Any]:
    """n tokens at once: the unscaled readouts (B, H, G, n, dv) and the state after them.

    With G_t the in-chunk cumulative log decay, unrolling the recurrence gives
      S_t = e^{G_t} S0 + sum_{s<=t} e^{G_t - G_s} k_s u_s^T,
    where u_s = v_s for the additive rules, and for the delta rules
      u_t = b_t (v_t - S0^T (e^{G_t} k_t) - sum_{s<t} B_ts u_s),  B_ts = k_t . (e^{G_t-G_s} k_s),
    a unit lower-triangular system. Only e^{G_t - G_s} with s <= t is ever
    formed, so no exponent is positive for a decaying gate.
    """
    n = k.shape[2]
    # Built on the device: no host transfer inside a captured step.
    incl = xp.tri(n, dtype=bool)
    strict = xp.tri(n, k=-1, dtype=bool)
    qk = None  # (B, H, G, n, n): q_t . (decayed) k_s
    kk = None  # (B, H, n, n): k_t . (decayed) k_s
    if g is None:
        eg = None
        qk = xp.matmul(q, xp.swapaxes(k, -1, -2)[:, :, None])
        if b is not None:
            kk = xp.matmul(k, xp.swapaxes(k, -1, -2))
    else:
        gc = xp.cumsum(g, axis=2)  # (B, H, n, dk or 1)
        eg = xp.exp(gc)
        diff = gc[:, :, :, None, :] - gc[:, :, None, :, :]  # (B, H, t, s, .)
        dec = xp.exp(xp.where(incl[:, :, None], diff, -xp.inf))
        if g.shape[-1] == 1:
            dec = dec[..., 0]
            qk = xp.matmul(q, xp.swapaxes(k, -1, -2)[:, :, None]) * dec[:, :, None]
            if b is not None:
                kk = xp.matmul(k, xp.swapaxes(k, -1, -2)) * dec
        else:
            kd = k[:, :, None, :, :] * dec  # (B, H, t, s, dk)
            # q_t . (e^{G_t-G_s} k_s) for every group member at once.
            qt = xp.transpose(q, (0, 1, 3, 4, 2))  # (B, H, t, dk, G)
            qk = xp.transpose(xp.matmul(kd, qt), (0, 1, 4, 2, 3))
            if b is not None:
                kk = xp.matmul(kd, k[:, :, :, :, None])[..., 0]
    if b is None:
        u = v
    else:
        k_dec = k if eg is None else k * eg
        rhs = b[:, :, :, None] * (v - xp.matmul(k_dec, s0))
        eye = xp.eye(n, dtype=np.float32)
        m = eye + b[:, :, :, None] * xp.where(strict, kk, 0.0)
        u = xp.linalg.solve(m, rhs)
    q_dec = q if eg is None else q * eg[:, :, None]
    o = xp.matmul(q_dec, s0[:, :, None]) + xp.matmul(xp.where(incl, qk, 0.0), u[:, :, None])
    if eg is None:
        s = s0 + xp.matmul(xp.swapaxes(k, -1, -2), u)
    else:
        tail = xp.exp(gc[:, :, -1:, :] - gc)  # e^{G_n - G_s}, (B, H, n, dk or 1)
        s = eg[:, :, -1, :, None] * s0 + xp.matmul(xp.swapaxes(k * tail, -1, -2), u)
    return o, s
