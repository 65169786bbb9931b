"""Pieces the torch-native kernels share: dtype mapping and host-value helpers."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from onnxep.errors import NotSupported
from onnxep.providers import NodeInfo, np_dtype

FLOATS = ["float", "double", "float16"]
INTS = ["int8", "int16", "int32", "int64", "uint8"]
NUMERIC = [*FLOATS, *INTS]

_NP_TO_TORCH = {
    np.dtype(np.float32): torch.float32,
    np.dtype(np.float64): torch.float64,
    np.dtype(np.float16): torch.float16,
    np.dtype(np.int8): torch.int8,
    np.dtype(np.int16): torch.int16,
    np.dtype(np.int32): torch.int32,
    np.dtype(np.int64): torch.int64,
    np.dtype(np.uint8): torch.uint8,
    np.dtype(np.bool_): torch.bool,
}


def torch_dtype(node: NodeInfo, elem: int) -> torch.dtype:
    """The torch dtype of ONNX element type ``elem``; declines the ones torch lacks."""
    dt = np_dtype(elem)
    if dt not in _NP_TO_TORCH:
        raise NotSupported(f"{node.op_type}: {dt} is not supported on torch")
    return _NP_TO_TORCH[dt]


def ints(value: Any) -> list[int]:
    """A host input (NumPy array) as a list of Python ints."""
    return [int(v) for v in np.asarray(value).reshape(-1)]


def no_legacy_broadcast(node: NodeInfo) -> None:
    if node.opset < 7:
        raise NotSupported(
            f"{node.op_type}: opset {node.opset} broadcast attributes are not supported on torch"
        )


def norm_axes(axes: list[int], rank: int) -> list[int]:
    return sorted(a + rank if a < 0 else a for a in axes)
