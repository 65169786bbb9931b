"""Conv through cuDNN (cudnnConvolutionForward, + cudnnAddTensor for the bias): capture-safe.

1-D runs as 2-D; groups (depthwise included) through cudnnSetConvolutionGroupCount;
asymmetric pads give cuDNN their symmetric part and pad the rest explicitly first
(``conv_plan``). What cuDNN cannot take goes to the generic kernel (im2col + CuPy's
matmul, which is not capture-safe): decided when the node is built where its static
types show it (the step's capture note then says why), else per input shape at run
time (``ConvRunner.shapes.reasons`` counts those calls).
"""

from __future__ import annotations

import logging
from typing import Any

from onnxep.providers.kernel import kernel, not_capture_safe
from onnxep.providers.ops import op_conv as generic

from . import conv_plan
from .cudnn_run import PerShape, build_refusal, contiguous, generic_note, padded

_log = logging.getLogger("onnxep.cuda.cudnn")
#: (cuDNN activation mode, dtype) -> why cudnnConvolutionBiasActivationForward refused it
_REFUSED: dict[tuple[int, str], str] = {}


def _spatial_rank(node: Any) -> int | None:
    ksh = node.attr("kernel_shape", None)
    if ksh is not None:
        return len(ksh)
    w = node.inputs[1] if len(node.inputs) > 1 else None
    return w.rank - 2 if w is not None and w.rank is not None else None


class ConvRunner:
    """A Conv node's cuDNN path: ``forward(x, w, b)`` gives the output, or None to fall back.

    ``fused`` (FusedConv) asks for ``act(conv + b)`` in one cuDNN call: ``(mode, coef)``
    of cudnnConvolutionBiasActivationForward; when cuDNN refuses that configuration the
    runner remembers it and returns the plain convolution plus bias (``forward`` then
    reports ``fused_done=False`` so the caller applies the activation itself).
    """

    def __init__(self, node: Any, xp: Any, op: str) -> None:
        self.xp = xp
        self.op = op
        (self.group, self.ksh, self.strides, self.dil, self.pb, self.pe, self.auto_pad) = (
            generic.conv_setup(node)
        )
        self.shapes = PerShape(op, node.name)
        self._unfusable: set[tuple] = set()

    def _build(self, x_shape, w_shape, dtype: str) -> Any:
        from .. import dnn

        geom = conv_plan.conv_geometry(
            x_shape,
            w_shape,
            group=self.group,
            kernel_shape=self.ksh,
            strides=self.strides,
            dilations=self.dil,
            pads_begin=self.pb,
            pads_end=self.pe,
            auto_pad=self.auto_pad,
        )
        if isinstance(geom, str):
            return geom
        conv = dnn.ConvForward(geom, dtype)
        bias = dnn.BiasAdd(geom.y_shape, dtype)
        return geom, conv, bias

    def forward(self, x: Any, w: Any, b: Any = None, fused: tuple[int, float] | None = None):
        """``(y, fused_done)``, or None when this call goes to the generic kernel."""
        from .. import dnn

        dt = x.dtype.name
        if (
            dt not in dnn.SUPPORTED_DTYPES
            or w.dtype != x.dtype
            or (b is not None and (b.dtype != x.dtype or b.shape != (w.shape[0],)))
        ):
            self.shapes.fell_back(f"dtypes {x.dtype}/{w.dtype} or bias shape")
            return None
        key = (tuple(x.shape), tuple(w.shape), dt)
        entry = self.shapes.get(key, lambda: self._build(x.shape, w.shape, dt))
        if isinstance(entry, str):
            self.shapes.fell_back(entry)
            return None
        geom, conv, bias_add = entry
        xp = self.xp
        xin = contiguous(xp, padded(xp, x, geom.pre_pad, 0.0), geom.x_shape)
        wc = contiguous(xp, w, geom.w_shape)
        first = conv.algo is None
        if fused is not None and key not in self._unfusable and (fused[0], dt) not in _REFUSED:
            bias = xp.ascontiguousarray(b) if b is not None else xp.zeros(geom.y_shape[1], x.dtype)
            try:
                y = conv.bias_activation(xin, wc, bias, *fused)
                return y.reshape(geom.out_shape), True
            except dnn.DnnError as exc:
                if not exc.not_supported:
                    raise
                # cuDNN does not fuse this: conv, bias, then the activation apart (still
                # capture-safe). Said once per (activation, dtype), which then is not retried.
                self._unfusable.add(key)
                if (fused[0], dt) not in _REFUSED:
                    _REFUSED[(fused[0], dt)] = str(exc)
                    _log.warning(
                        "%s: cuDNN does not fuse activation mode %d for %s (%s); the "
                        "activation runs as a separate kernel",
                        self.op,
                        fused[0],
                        dt,
                        exc,
                    )
        try:
            y = conv(xin, wc)
        except dnn.DnnError as exc:
            if not (first and exc.not_supported):
                raise
            self.shapes.refuse(key, f"cuDNN refused it: {exc}")
            self.shapes.fell_back(f"cuDNN refused it: {exc}")
            return None
        if b is not None:
            bias_add(y, xp.ascontiguousarray(b))
        return y.reshape(geom.out_shape), False


@kernel("Conv", since=(1, 11, 22))
def conv(node, xp):
    fallback = generic.conv(node, xp)
    why = build_refusal(node, "Conv", _spatial_rank(node))
    if why is not None:
        return not_capture_safe(fallback, generic_note(why))
    runner = ConvRunner(node, xp, "Conv")

    def run(x, w, b=None):
        out = runner.forward(x, w, b)
        if out is None:
            return fallback(x, w, b)
        return (out[0],)

    run.cudnn = runner  # the per-shape plans and fallback counts, for tests and profiles
    return run
