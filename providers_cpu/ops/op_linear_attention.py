"""com.microsoft LinearAttention on NumPy: a decode step (one token, no state window) in
one compiled pass (linear_attention_jit); prefill (the generic kernel's chunks), state
windows, other dtypes, or numba off, run the generic kernel.
"""

from __future__ import annotations

import math

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_linear_attention import linear_attention as generic

from .. import jit
from . import linear_attention_jit
from .norms_jit import rows_ok

_F32 = np.dtype(np.float32)


@kernel("LinearAttention", domain="com.microsoft", dtypes=("float", "float16", "bfloat16"))
def linear_attention(node, xp):
    general = generic(node, xp)  # also refuses what it does not support
    if not jit.ENABLED or int(node.attr("state_window", 0)) != 0:
        return general
    if any(
        node.has_output(j) and node.outputs[j].dtype not in (None, _F32)
        for j in range(min(node.num_outputs, 2))
    ):
        return general
    hq = int(node.attr("q_num_heads"))
    hkv = int(node.attr("kv_num_heads"))
    rule = node.attr("update_rule", "gated_delta")
    rule = rule.decode() if isinstance(rule, bytes) else str(rule)
    gated = rule in ("gated", "gated_delta")
    delta = rule in ("delta", "gated_delta")
    scale_attr = float(node.attr("scale", 0.0))
    n_out = max(node.num_outputs, 1)

    def fits(query, key, value, past_state, decay, beta) -> bool:
        if query.ndim != 3 or query.shape[1] != 1 or key.ndim != 3 or value.ndim != 3:
            return False
        bsz, _, qh = query.shape
        dk = qh // hq
        if dk == 0 or dk * hq != qh or key.shape[:2] != (bsz, 1) or value.shape[:2] != (bsz, 1):
            return False
        nk = key.shape[2] // dk
        dv = value.shape[2] // hkv
        if nk == 0 or dv == 0 or nk * dk != key.shape[2] or dv * hkv != value.shape[2] or hkv % nk:
            return False
        if not rows_ok(query, key, value):
            return False
        if past_state is not None and (
            past_state.shape != (bsz, hkv, dk, dv) or not rows_ok(past_state)
        ):
            return False
        if gated and (
            decay is None
            or decay.shape[:2] != (bsz, 1)
            or decay.shape[2:] not in ((hkv * dk,), (hkv,))
            or not rows_ok(decay)
        ):
            return False
        if delta and (
            beta is None
            or beta.shape[:2] != (bsz, 1)
            or beta.shape[2:] not in ((hkv,), (1,))
            or not rows_ok(beta)
        ):
            return False
        return True

    def run(query, key, value, past_state=None, decay=None, beta=None):
        if not fits(query, key, value, past_state, decay, beta):
            return general(query, key, value, past_state, decay, beta)
        bsz = query.shape[0]
        dk = query.shape[2] // hq
        scale = scale_attr if scale_attr != 0.0 else 1.0 / math.sqrt(dk)
        o, present = linear_attention_jit.token(
            query.reshape(bsz, -1),
            key.reshape(bsz, -1),
            value.reshape(bsz, -1),
            past_state,
            decay.reshape(bsz, -1) if gated else None,
            beta.reshape(bsz, -1) if delta else None,
            hq,
            hkv,
            dk,
            scale,
        )
        return ((o, present) + (None,) * (n_out - 2))[:n_out]

    return run
