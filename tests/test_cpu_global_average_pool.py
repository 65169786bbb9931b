"""GlobalAveragePool on the CPU provider as one GEMV (providers_cpu/ops/op_global_average_pool.py):
the mean of every map to float rounding, onnxruntime's values, other dtypes through the
generic kernel, and empty batches, channels and maps."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxep
from onnxep.testing import compare_output

ort = pytest.importorskip("onnxruntime")

_ELEM = {np.float32: onnx.TensorProto.FLOAT, np.float64: onnx.TensorProto.DOUBLE,
         np.float16: onnx.TensorProto.FLOAT16}  # fmt: skip


def _session(ndim: int, dtype) -> onnxep.InferenceSession:
    node = helper.make_node("GlobalAveragePool", ["x"], ["y"])
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", _ELEM[dtype], [None] * ndim)],
        [helper.make_tensor_value_info("y", _ELEM[dtype], None)],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    return model, onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize(
    "shape", [(1, 200, 7, 7), (2, 512, 8, 20), (1, 480, 2, 2), (3, 5, 17), (2, 3, 4, 5, 6)]
)
def test_means_match_onnxruntime(shape, dtype):
    model, sess = _session(len(shape), dtype)
    x = (np.random.default_rng(len(shape)).standard_normal(shape) + 0.5).astype(dtype)
    got = sess.run(None, {"x": x})[0]
    assert got.dtype == dtype and got.shape == (*shape[:2], *[1] * (len(shape) - 2))
    want = x.astype(np.float64).mean(axis=tuple(range(2, len(shape))), keepdims=True)
    tol = {np.float32: 1e-6, np.float64: 1e-13, np.float16: 2e-3}[dtype]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    if dtype == np.float32:  # onnxruntime's CPU provider has it for float32 only
        peer = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        bad = compare_output("y", got, peer.run(None, {"x": x})[0], "cpu", "ort")
        assert all(r.ok for r in bad), [r.describe() for r in bad]


@pytest.mark.parametrize("shape", [(0, 4, 3, 3), (2, 0, 3, 3), (2, 4, 0, 3)])
def test_empty_inputs(shape):
    _, sess = _session(4, np.float32)
    got = sess.run(None, {"x": np.zeros(shape, np.float32)})[0]
    assert got.shape == (*shape[:2], 1, 1) and got.dtype == np.float32
    # a map of no positions: the generic kernel's mean of nothing, 0
    np.testing.assert_array_equal(got, np.zeros_like(got))


def test_non_finite_values_propagate():
    _, sess = _session(4, np.float32)
    x = np.ones((1, 3, 4, 4), np.float32)
    x[0, 0, 1, 1] = np.nan
    x[0, 1, 2, 2] = np.inf
    got = sess.run(None, {"x": x})[0].reshape(-1)
    assert np.isnan(got[0]) and got[1] == np.inf and got[2] == 1.0
