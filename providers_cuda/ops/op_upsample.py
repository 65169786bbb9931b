"""Upsample on CUDA (opset 7 scales attribute, opset 9 scales input): Resize's device plans."""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops import op_resize as generic
from onnxep.providers.ops import op_upsample as generic_upsample

from .op_resize import resize_runner


@kernel("Upsample", since=7)
def upsample_7(node: NodeInfo, xp: Any):
    mode = generic_upsample.upsample_mode(node)
    attrs = generic.legacy_attrs(mode, generic_upsample.upsample_7_scales(node))
    return resize_runner(node, xp, attrs, legacy=True)


@kernel("Upsample", since=(9, 10), host_inputs=(1,))
def upsample_9(node: NodeInfo, xp: Any):
    attrs = generic.legacy_attrs(generic_upsample.upsample_mode(node))
    return resize_runner(node, xp, attrs, legacy=True)
