"""com.microsoft FusedConv: act(Conv(X, W) + B + Z), the op the Conv + activation fusion emits.

Relu runs in the convolution's epilogue (cudnnConvolutionBiasActivationForward with
CUDNN_ACTIVATION_RELU); Clip(0, c) as CUDNN_ACTIVATION_CLIPPED_RELU with ceiling c. When
cuDNN refuses a fused configuration (it documents RELU; CLIPPED_RELU and float16 bias
support vary by release), and for every other activation or a Z input, the Conv runs
as in ``op_conv`` and the rest follows as CuPy elementwise kernels in place on its
fresh output (capture-safe too). Without cuDNN it is the generic Conv and the same
elementwise tail, not capture-safe.
"""

from __future__ import annotations

import math

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel, not_capture_safe
from onnxep.providers.ops import op_conv as generic
from onnxep.providers.ops.inplace_activation import inplace_activation
from onnxep.providers.ops.nn import str_attr

from .cudnn_run import build_refusal, generic_note
from .op_conv import ConvRunner, _spatial_rank


def fused_mode(name: str, params) -> tuple[int, float] | None:
    """cuDNN's (activation mode, coef) for this activation, or None when it is not fused."""
    from .. import dnn

    p = [float(v) for v in (params or [])]
    if name == "Relu":
        return dnn.ACT_RELU, 0.0
    if name == "Clip" and len(p) >= 2 and p[0] == 0.0 and math.isfinite(p[1]) and p[1] > 0:
        return dnn.ACT_CLIPPED_RELU, p[1]
    return None


@kernel("FusedConv", since=1, domain="com.microsoft")
def fused_conv(node, xp):
    name = str_attr(node, "activation", "")
    params = node.attr("activation_params", None)
    act = inplace_activation(xp, name, params) if name else None
    if name and act is None:
        raise NotSupported(f"FusedConv: activation {name!r} is not supported")
    conv_fallback = generic.conv(node, xp)

    def tail(y, z):
        y = y if y.flags.c_contiguous else xp.ascontiguousarray(y)
        if z is not None:
            y += z.astype(y.dtype, copy=False)
        if act is not None:
            act(y)
        return (y,)

    def generic_run(x, w, b=None, z=None):
        (y,) = conv_fallback(x, w, b)
        return tail(y, z)  # y is the generic kernel's fresh output

    why = build_refusal(node, "FusedConv", _spatial_rank(node))
    if why is not None:
        return not_capture_safe(generic_run, generic_note(why))
    runner = ConvRunner(node, xp, "FusedConv")
    mode = fused_mode(name, params) if name else None

    def run(x, w, b=None, z=None):
        out = runner.forward(x, w, b, fused=mode if z is None else None)
        if out is None:
            return generic_run(x, w, b, z)
        y, done = out
        if done:
            return (y,)
        return tail(y, z)

    run.cudnn = runner
    return run
