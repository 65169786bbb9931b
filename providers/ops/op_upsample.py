"""Upsample (deprecated; opset 7 scales attribute, opset 9 scales input): asymmetric resize."""

from __future__ import annotations

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel

from .nn import str_attr
from .op_resize import legacy_run


def upsample_mode(node) -> str:
    mode = str_attr(node, "mode", "nearest")
    if mode == "bilinear":
        mode = "linear"
    if mode not in ("nearest", "linear"):
        raise NotSupported(f"Upsample: mode {mode!r} is not supported (nearest, linear)")
    return mode


def upsample_7_scales(node) -> list[float]:
    return [float(v) for v in node.attr("scales")]


@kernel("Upsample", since=7)
def upsample_7(node, xp):
    return legacy_run(xp, upsample_mode(node), upsample_7_scales(node))


@kernel("Upsample", since=(9, 10), host_inputs=(1,))
def upsample_9(node, xp):
    return legacy_run(xp, upsample_mode(node))
