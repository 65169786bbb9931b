"""Resize/Upsample cases shared by the GPU tests (test_cuda_resize.py) and the emulated ones
(tests/test_cuda_resize_emulated.py): ONNX's node cases and our own shapes."""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import onnx
from onnx import helper


def onnx_node_cases() -> dict:
    """ONNX's node cases for Resize and Upsample, by name (only their case modules are
    imported: loading the whole node suite takes many seconds)."""
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for mod in ("resize", "upsample"):
            importlib.import_module(f"onnx.backend.test.case.node.{mod}")
    return {
        c.name: c
        for c in node._NodeTestCases  # noqa: SLF001 - onnx collects them there
        if ("resize" in c.name or "upsample" in c.name) and not c.name.endswith("_expanded")
    }


def resize_model(x_shape, dtype, attrs, *, scales=None, sizes=None, roi=None, opset=19):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inits = []
    names = ["x", "", "", ""]
    for i, (nm, v) in enumerate((("roi", roi), ("scales", scales), ("sizes", sizes)), 1):
        if v is not None:
            arr = np.asarray(v, np.int64 if nm == "sizes" else np.float32)
            inits.append(onnx.numpy_helper.from_array(arr, nm))
            names[i] = nm
    while names[-1] == "":
        names.pop()
    node = helper.make_node("Resize", names, ["y"], **attrs)
    g = helper.make_graph(
        [node],
        "resize",
        [helper.make_tensor_value_info("x", elem, x_shape)],
        [helper.make_tensor_value_info("y", elem, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def data(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -100), min(info.max, 100), shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


OWN = [
    ("u8-bilinear-image", (1, 3, 7, 9), np.uint8, {"mode": "linear"}, {"sizes": [1, 3, 12, 5]}),
    ("i8-cubic-x2", (1, 2, 5, 4), np.int8, {"mode": "cubic"}, {"scales": [1, 1, 2, 2]}),
    ("f16-bilinear-x2", (1, 3, 5, 7), np.float16, {"mode": "linear"}, {"scales": [1, 1, 2, 2]}),
    ("f32-odd-sizes-cubic", (2, 3, 7, 5), np.float32,
     {"mode": "cubic", "coordinate_transformation_mode": "align_corners"},
     {"sizes": [2, 3, 11, 3]}),
    ("f32-antialias-down-linear", (1, 2, 17, 13), np.float32,
     {"mode": "linear", "antialias": 1}, {"sizes": [1, 2, 5, 4]}),
    ("f32-antialias-down-cubic", (1, 1, 23, 19), np.float32,
     {"mode": "cubic", "antialias": 1, "exclude_outside": 1}, {"scales": [1, 1, 0.3, 0.45]}),
    ("f16-antialias-down-cubic", (1, 2, 16, 9), np.float16,
     {"mode": "cubic", "antialias": 1}, {"scales": [1, 1, 0.5, 0.7]}),
    ("f32-5d-trilinear", (1, 2, 3, 4, 5), np.float32,
     {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"},
     {"scales": [1, 1, 2, 1.5, 0.6]}),
    ("f32-axes", (2, 5, 6, 3), np.float32,
     {"mode": "linear", "axes": [2, 1]}, {"sizes": [9, 4]}),
    ("f64-cubic", (1, 2, 6, 6), np.float64,
     {"mode": "cubic", "coordinate_transformation_mode": "half_pixel_symmetric"},
     {"scales": [1, 1, 1.7, 0.8]}),
    ("f32-not-larger", (1, 3, 10, 6), np.float32,
     {"mode": "linear", "axes": [2, 3], "keep_aspect_ratio_policy": "not_larger"},
     {"sizes": [7, 7]}),
    ("f32-crop-extrapolate", (1, 2, 6, 8), np.float32,
     {"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
      "extrapolation_value": -3.5},
     {"roi": [0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3], "sizes": [1, 2, 5, 9]}),
    ("f16-nearest-x2-detector", (1, 16, 20, 20), np.float16,
     {"mode": "nearest"}, {"scales": [1, 1, 2, 2]}),
    ("u8-nearest-ceil", (2, 3, 5, 7), np.uint8,
     {"mode": "nearest", "nearest_mode": "ceil", "coordinate_transformation_mode": "asymmetric"},
     {"sizes": [2, 3, 9, 4]}),
    ("i64-nearest-5d", (2, 1, 3, 4, 5), np.int64, {"mode": "nearest"},
     {"scales": [1, 3, 0.7, 1, 2]}),
    ("i8-nearest-crop-extrapolate", (1, 1, 6, 6), np.int8,
     {"mode": "nearest", "coordinate_transformation_mode": "tf_crop_and_resize",
      "extrapolation_value": 7.0},
     {"roi": [0, 0, -0.3, 0.2, 1, 1, 1.2, 0.8], "sizes": [1, 1, 7, 5]}),
    ("f32-nearest-round-prefer-ceil-down", (1, 2, 9, 11), np.float32,
     {"mode": "nearest", "nearest_mode": "round_prefer_ceil"}, {"scales": [1, 1, 0.6, 0.4]}),
    ("f32-unchanged", (1, 2, 3, 4), np.float32, {"mode": "linear"}, {"scales": [1, 1, 1, 1]}),
    ("f32-empty-out", (1, 2, 3, 4), np.float32, {"mode": "linear"}, {"sizes": [1, 2, 0, 4]}),
]  # fmt: skip
