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
from typing import Any

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel, not_capture_safe
from onnxep.providers.ops import op_conv as generic
from onnxep.providers.ops.nn import str_attr

from .cudnn_run import build_refusal, generic_note
from .op_conv import ConvRunner, _spatial_rank


def activation(xp: Any, name: str, params) -> Any:
    """An in-place activation on a CuPy float array, or None for an unknown name."""
    p = [float(v) for v in (params or [])]
    if name == "Relu":
        return lambda y: xp.maximum(y, 0, out=y)
    if name == "LeakyRelu":
        a = p[0] if p else 0.01

        def leaky(y):
            y[...] = xp.where(y < 0, y * y.dtype.type(a), y)

        return leaky
    if name == "Sigmoid":

        def sigmoid(y):
            xp.negative(y, out=y)
            xp.exp(y, out=y)
            y += 1
            xp.reciprocal(y, out=y)

        return sigmoid
    if name == "Tanh":
        return lambda y: xp.tanh(y, out=y)
    if name == "Clip":
        lo = p[0] if len(p) > 0 else -math.inf
        hi = p[1] if len(p) > 1 else math.inf
        return lambda y: xp.clip(y, lo, hi, out=y)
    if name == "HardSigmoid":
        a = p[0] if len(p) > 0 else 0.2
        b = p[1] if len(p) > 1 else 0.5

        def hard_sigmoid(y):
            y *= a
            y += b
            xp.clip(y, 0, 1, out=y)

        return hard_sigmoid
    return None


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
    act = activation(xp, name, params) if name else None
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
