"""ONNX LinearAttention (opset 27): linear / gated / delta / gated-delta recurrences.

Runs the recurrence token by token (a loop over the time axis) in float32 or
float64; chunk_size is only a tuning hint and does not change results.
"""

from __future__ import annotations

import math

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.attention import compute_dtype, widen

_RULES = ("linear", "gated", "delta", "gated_delta")


@kernel("LinearAttention", since=27, dtypes=("float", "float16", "bfloat16", "double"))
def linear_attention(node: NodeInfo, xp):
    rule = node.attr("update_rule", "gated_delta")
    rule = rule.decode() if isinstance(rule, bytes) else rule
    if rule not in _RULES:
        raise NotSupported(f"LinearAttention: update_rule {rule!r} is not one of {_RULES}")
    hq = int(node.attr("q_num_heads"))
    hkv = int(node.attr("kv_num_heads"))
    if hq <= 0 or hkv <= 0 or hq % hkv:
        raise NotSupported(
            f"LinearAttention: q_num_heads {hq} must be a multiple of kv_num_heads {hkv}"
        )
    scale_attr = float(node.attr("scale", 0.0))
    gating = rule in ("gated", "gated_delta")
    delta = rule in ("delta", "gated_delta")
    g = hq // hkv

    def run(q, k, v, past=None, decay=None, beta=None):
        ct = compute_dtype(q.dtype)
        b, t, _ = q.shape
        dk = q.shape[-1] // hq
        dv = v.shape[-1] // hkv
        # (B, T, H*D) -> (B, T, H, D): time stays the leading loop axis after B
        q5 = xp.reshape(widen(q, ct), (b, t, hkv, g, dk))
        k4 = xp.reshape(widen(k, ct), (b, t, hkv, dk))
        v4 = xp.reshape(widen(v, ct), (b, t, hkv, dv))
        if gating:
            if decay is None:
                raise ValueError(f"LinearAttention: update_rule {rule!r} needs decay")
            per = decay.shape[-1] // hkv  # 1 (per head) or dk (per key dim)
            dec = xp.exp(xp.reshape(widen(decay, ct), (b, t, hkv, per)))
        if delta:
            if beta is None:
                raise ValueError(f"LinearAttention: update_rule {rule!r} needs beta")
            bet = xp.reshape(widen(beta, ct), (b, t, beta.shape[-1], 1))
        if past is not None:
            state = widen(past, ct)
            st_dt = past.dtype
        else:
            state = xp.zeros((b, hkv, dk, dv), dtype=ct)
            st_dt = q.dtype
        scale = scale_attr if scale_attr else 1.0 / math.sqrt(dk)
        outs = []
        for i in range(t):
            kt = k4[:, i]  # (B, Hkv, dk)
            vt = v4[:, i]
            if gating:
                state = state * dec[:, i][..., None]
            if delta:
                got = xp.matmul(kt[:, :, None, :], state)[:, :, 0, :]  # S^T k
                vt = bet[:, i] * (vt - got)
            state = state + kt[..., :, None] * vt[..., None, :]
            outs.append(xp.matmul(q5[:, i], state))  # (B, Hkv, G, dv)
        y = xp.stack(outs, axis=1) * ct.type(scale)  # (B, T, Hkv, G, dv)
        y = xp.reshape(y, (b, t, hq * dv)).astype(q.dtype)
        return (y, state.astype(st_dt))

    return run
