"""SwiGLU (opset 28): Swish_alpha(A) * B."""

from __future__ import annotations

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.attention import compute_dtype, widen


@kernel("SwiGLU", since=28, dtypes=("float", "float16", "bfloat16", "double"))
def swiglu(node: NodeInfo, xp):
    alpha = float(node.attr("alpha", 1.0))

    def run(a, b):
        ct = compute_dtype(a.dtype)
        af = widen(a, ct)
        # a * sigmoid(alpha * a), with sigmoid written so large |a| cannot overflow exp
        z = xp.exp(-xp.abs(af * ct.type(alpha)))
        sig = xp.where(af * alpha >= 0, 1 / (1 + z), z / (1 + z))
        return ((af * sig * widen(b, ct)).astype(a.dtype),)

    return run
