"""com.microsoft GatedRMSNorm on NumPy: float32 in one compiled pass (norms_jit).

The generic kernel's twelve NumPy calls took 41 us a node on a hybrid decoder's step;
other dtypes, strides, or numba off, run it.
"""

from __future__ import annotations

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_gated_rms_norm import gated_rms_norm as generic

from . import norms_jit


@kernel("GatedRMSNorm", domain="com.microsoft", dtypes=("float", "float16", "bfloat16"))
def gated_rms_norm(node, xp):
    general = generic(node, xp)  # also refuses unknown activations
    if not norms_jit.enabled():
        return general
    act = node.attr("activation", "silu")
    silu = (act.decode() if isinstance(act, bytes) else str(act)) != "sigmoid"
    eps = float(node.attr("epsilon", 1e-5))

    def run(x, scale, gate):
        c = scale.size
        if (
            scale.ndim == 1
            and c
            and x.ndim
            and x.shape[-1] % c == 0
            and gate.shape == x.shape
            and norms_jit.rows_ok(x, scale, gate)
        ):
            return (norms_jit.gated_rms(x, gate, scale, eps, silu),)
        return general(x, scale, gate)

    return run
