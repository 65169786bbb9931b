"""One row times a large constant float32 weight (providers_cpu/ops/gemv.py).

The compiled GEMV must give the product to float rounding for short and long K (one
piece, a K cut unevenly, rows left over from the four-row passes), the same bits on one
thread and on several (the pieces depend on the shape alone), NaN and infinity where
BLAS gives them, and a MatMul session's values against onnxruntime's.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import onnxep
from onnxep.providers_cpu import jit
from onnxep.providers_cpu.ops import gemv, nn_cpu

pytestmark = pytest.mark.skipif(not jit.ENABLED, reason="numba not installed: no compiled loop")


@pytest.mark.parametrize("k, n", [(64, 4099), (67, 4096), (513, 1000), (1030, 333), (4, 70000)])
def test_row_matches_float64(k, n):
    rng = np.random.default_rng(k)
    a = rng.standard_normal((1, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    y = gemv.row_times(a, w)
    want = a.astype(np.float64) @ w.astype(np.float64)
    assert y.shape == (1, n) and y.dtype == np.float32
    np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-5 * np.sqrt(k))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_thread_split_gives_the_same_bits(monkeypatch, threads):
    rng = np.random.default_rng(3)
    a = rng.standard_normal(1000).astype(np.float32)
    w = rng.standard_normal((1000, 700)).astype(np.float32)
    monkeypatch.setattr(nn_cpu, "run_threads", lambda: 1)
    one = gemv.row_times(a, w)
    monkeypatch.setattr(nn_cpu, "run_threads", lambda: threads)
    monkeypatch.setattr(nn_cpu, "COMPILED_MIN", 0)  # split this product
    assert gemv.row_times(a, w).tobytes() == one.tobytes()
    monkeypatch.setattr(nn_cpu, "NATIVE", False)  # the executor's split
    monkeypatch.setattr(nn_cpu, "_PARALLEL_MIN", 0)
    assert gemv.row_times(a, w).tobytes() == one.tobytes()


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_nan_and_infinity_propagate():
    rng = np.random.default_rng(2)
    a = rng.standard_normal(512).astype(np.float32)
    w = rng.standard_normal((512, 600)).astype(np.float32)
    a[5] = np.nan
    w[7, 3] = np.inf
    w[400, 9] = -np.inf
    y, want = gemv.row_times(a, w)[0], a @ w
    assert np.isnan(y).all() and np.isnan(want).all()
    a[5] = 1.0
    y, want = gemv.row_times(a, w)[0], a @ w
    np.testing.assert_array_equal(np.isinf(y), np.isinf(want))
    np.testing.assert_array_equal(y[np.isinf(y)], want[np.isinf(want)])


def test_fits_only_large_contiguous_float32():
    w = np.zeros((512, 512), np.float32)
    assert gemv.fits(w)
    assert not gemv.fits(w[:, :256])  # not contiguous
    assert not gemv.fits(w.astype(np.float64))
    assert not gemv.fits(w[:64, :64].copy())  # small: NumPy's GEMV


@pytest.mark.parametrize("shape", [[1, 1, 768], [1, 768]])
def test_matmul_session_matches_onnxruntime(shape):
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(1)
    w = rng.standard_normal((768, 1000)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [*shape[:-1], 1000])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)]
    ).SerializeToString()
    a = rng.standard_normal(shape).astype(np.float32)
    ours = onnxep.InferenceSession(model, providers=["cpu"]).run(None, {"a": a})[0]
    theirs = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"a": a})[0]
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours, theirs, rtol=2e-5, atol=1e-4)
    np.testing.assert_allclose(ours, a.astype(np.float64) @ w, rtol=2e-5, atol=1e-4)
