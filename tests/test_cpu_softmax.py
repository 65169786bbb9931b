"""The CPU provider's Softmax and LogSoftmax (providers_cpu/ops/op_softmax.py) give the
generic kernels' bits: the same operations in the same order, in fewer buffers."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxep
from onnxep.providers.ops.reduce import log_softmax, softmax


def _model(op: str, opset: int, axis: int | None, shape, elem=TensorProto.FLOAT) -> bytes:
    attrs = {} if axis is None else {"axis": axis}
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", elem, list(shape))],
        [helper.make_tensor_value_info("y", elem, None)],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)]
    ).SerializeToString()


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize(
    ("opset", "axis", "shape", "axes"),
    [
        (13, None, (4, 300), -1),
        (13, 1, (2, 7, 5), 1),
        (13, 0, (3, 4), 0),
        (11, 1, (2, 3, 5), (1, 2)),  # before 13: the flattened trailing dims
        (11, None, (2, 3, 5), (1, 2)),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_same_bits_as_the_generic_kernel(op, opset, axis, shape, axes, dtype):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 6).astype(dtype)
    flat = x.reshape(-1)
    flat[:4] = [-np.inf, np.inf, np.nan, 80.0]
    x[-1] = -np.inf  # a slice of -inf only: shifted by 0, as the generic kernel does
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    sess = onnxep.InferenceSession(_model(op, opset, axis, shape, elem), providers=["cpu"])
    with np.errstate(all="ignore"):
        want = (softmax if op == "Softmax" else log_softmax)(x, axes, np)
        for _ in range(2):
            got = sess.run(None, {"x": x})[0]
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
