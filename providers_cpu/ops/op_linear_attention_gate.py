"""com.microsoft LinearAttentionGate on NumPy: float32 in one compiled pass (norms_jit).

The generic kernel's NumPy passes (softplus and sigmoid in their overflow-safe forms)
took 24 us a node on a hybrid decoder's step; other dtypes, strides or shapes, or numba
off, run it.
"""

from __future__ import annotations

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_linear_attention_gate import linear_attention_gate as generic

from . import norms_jit


@kernel("LinearAttentionGate", domain="com.microsoft", dtypes=("float", "float16", "bfloat16"))
def linear_attention_gate(node, xp):
    general = generic(node, xp)
    if not norms_jit.enabled():
        return general
    want_beta = node.has_output(1)
    n_out = max(node.num_outputs, 1)

    def run(a, dt_bias, decay_scale, b=None):
        h = a.shape[-1] if a.ndim else 0
        if (
            h
            and dt_bias.size == h
            and decay_scale.size == h
            and norms_jit.rows_ok(a, dt_bias, decay_scale)
            and (not want_beta or (b is not None and norms_jit.rows_ok(b)))
        ):
            decay, beta = norms_jit.attention_gate(
                a, dt_bias.reshape(h), decay_scale.reshape(h), b if want_beta else None
            )
            return (decay, beta) + (None,) * (n_out - 2) if n_out >= 2 else (decay,)
        return general(a, dt_bias, decay_scale, b)

    return run
