"""onnxep::GatedLinearAttention: com.microsoft LinearAttention with its gates, and optionally
the per-head L2 normalisation of q and k, computed inside.

Inputs ``(query, key, value, past_state?, a, dt_bias, decay_scale, b?)``;
outputs ``(output, present_state?)``. Attributes: LinearAttention's
(``q_num_heads``, ``kv_num_heads``, ``update_rule`` gated or gated_delta,
``scale``, ``state_window``, ``chunk_size``) and

- ``q_l2_norm`` / ``k_l2_norm`` (int, default 0): divide each head's d_k
  values of q / k by their L2 norm first (``LpNormalization(p=2)`` over the
  head, 0 where the norm is 0), rounded to the storage type;
- ``q_scale`` (float, default 1): then multiply q by this, rounded to the
  storage type (the ``Mul`` an export puts between q's norm and the attention).

The gates are ``LinearAttentionGate``'s: ``decay = decay_scale *
softplus(a + dt_bias)`` and ``beta = sigmoid(b)`` in float32, each rounded to
a's type (``providers/ops/op_linear_attention_gate.py``); ``fuse_linear_attention_gates``
emits this op and ``fuse_linear_attention_l2_norm`` sets the norm attributes
(``onnxep.providers.fusions``).

This generic kernel runs the unfused nodes' own generic kernels in order
(the gate's arithmetic, LpNormalization, Mul, LinearAttention), so on the CPU
the fused node gives exactly what the nodes it replaced gave; the CUDA kernel
computes the gates and norms while staging each token (one launch).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument, NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import contrib as C
from .op_linear_attention import linear_attention
from .op_lp_normalization import lp_normalization

OP = "GatedLinearAttention"
GATED_RULES = ("gated", "gated_delta")


def gated_rule(node: NodeInfo) -> str:
    rule = node.attr("update_rule", "gated_delta")
    rule = rule.decode() if isinstance(rule, bytes) else str(rule)
    if rule not in GATED_RULES:
        raise NotSupported(f"onnxep::{OP}: update_rule {rule!r} is not one of {GATED_RULES}")
    return rule


def gates(xp: Any, a: Any, dt_bias: Any, decay_scale: Any, b: Any) -> tuple[Any, Any]:
    """LinearAttentionGate's decay and beta (beta None without b), in a's type."""
    h = a.shape[-1]
    for name, v in (("dt_bias", dt_bias), ("decay_scale", decay_scale)):
        if int(np.prod(v.shape)) != h:
            raise InvalidArgument(
                f"onnxep::{OP}: {name} has shape {tuple(v.shape)}; it must hold one value per "
                f"last dim of a ({h})"
            )
    bias = C.up(dt_bias, xp, np.float32).reshape(h)
    scale = C.up(decay_scale, xp, np.float32).reshape(h)
    decay = C.down(scale * C.softplus(C.up(a, xp, np.float32) + bias, xp), a.dtype)
    beta = None if b is None else C.down(C.sigmoid(C.up(b, xp, np.float32), xp), a.dtype)
    return decay, beta


@kernel(OP, domain="onnxep", dtypes=("float", "float16", "bfloat16"))
def gated_linear_attention(node: NodeInfo, xp: Any):
    rule = gated_rule(node)
    hq = int(node.attr("q_num_heads"))
    q_norm = bool(node.attr("q_l2_norm", 0))
    k_norm = bool(node.attr("k_l2_norm", 0))
    q_scale = float(node.attr("q_scale", 1.0))
    attend = linear_attention(node, xp)
    l2 = lp_normalization(NodeInfo("LpNormalization", "", node.name, 22, {"axis": -1, "p": 2}), xp)
    needs_beta = rule == "gated_delta"

    def per_head_l2(x: Any, what: str, dk: int) -> Any:
        bsz, seq, width = x.shape
        if dk == 0 or width % dk:
            raise InvalidArgument(
                f"onnxep::{OP}: {what} width {width} is not a multiple of the head size {dk}"
            )
        return l2(x.reshape(bsz, seq, width // dk, dk))[0].reshape(bsz, seq, width)

    def run(query, key, value, past_state=None, a=None, dt_bias=None, decay_scale=None, b=None):
        if a is None or dt_bias is None or decay_scale is None:
            raise InvalidArgument(f"onnxep::{OP}: inputs a, dt_bias and decay_scale are required")
        if needs_beta and b is None:
            raise InvalidArgument(f"onnxep::{OP}: input b is required for update_rule={rule}")
        if query.ndim != 3 or key.ndim != 3:
            raise InvalidArgument(f"onnxep::{OP}: query and key must be 3-D (batch, seq, hidden)")
        dk = query.shape[2] // hq
        if q_norm:
            query = per_head_l2(query, "query", dk)
        if q_scale != 1.0:
            query = xp.multiply(query, xp.asarray(q_scale, dtype=query.dtype))
        if k_norm:
            key = per_head_l2(key, "key", dk)
        decay, beta = gates(xp, a, dt_bias, decay_scale, b if needs_beta else None)
        return attend(query, key, value, past_state, decay, beta)

    return run
