"""The CPU provider's Where (providers_cpu/ops/op_where.py): a bit select on large outputs,
the same bits as np.where (NaN payloads, signed zeros), broadcasting as ONNX says."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.helper import np_dtype_to_tensor_dtype

import onnxep


def _session(shapes, dtype):
    names = ["c", "x", "y"]
    types = [TensorProto.BOOL, *[np_dtype_to_tensor_dtype(np.dtype(dtype))] * 2]
    graph = helper.make_graph(
        [helper.make_node("Where", names, ["z"])],
        "g",
        [helper.make_tensor_value_info(n, t, list(s)) for n, t, s in zip(names, types, shapes)],
        [helper.make_tensor_value_info("z", types[1], None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    return onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])


@pytest.mark.parametrize(
    "shapes",
    [
        ((4, 64, 96), (4, 64, 96), (4, 64, 96)),  # every input full size
        ((1, 1, 96), (4, 64, 96), ()),  # a broadcast mask and a scalar fill
        ((4, 64, 96), (), (4, 64, 96)),
        ((4, 64, 1), (1, 64, 96), (4, 1, 96)),  # the output larger than every input
        ((2, 3), (2, 3), (2, 3)),  # small: np.where itself
    ],
)
@pytest.mark.parametrize(
    "dtype", [np.float32, np.float64, np.int64, np.int32, np.float16, np.uint8, np.bool_]
)
def test_same_bits_as_numpy_where(shapes, dtype):
    rng = np.random.default_rng(0)
    c = rng.random(shapes[0]) < 0.5
    if np.dtype(dtype).kind == "f":
        x = rng.standard_normal(shapes[1]).astype(dtype)
        y = rng.standard_normal(shapes[2]).astype(dtype)
        for v in (x, y):
            flat = v.reshape(-1)
            flat[: min(3, flat.size)] = [np.nan, -0.0, np.inf][: min(3, flat.size)]
    else:
        x = rng.integers(0, 2 if dtype == np.bool_ else 100, shapes[1]).astype(dtype)
        y = rng.integers(0, 2 if dtype == np.bool_ else 100, shapes[2]).astype(dtype)
    sess = _session(shapes, dtype)
    for _ in range(2):
        got = sess.run(None, {"c": c, "x": x, "y": y})[0]
        want = np.where(c, x, y)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()
