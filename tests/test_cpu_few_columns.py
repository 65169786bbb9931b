"""The compiled few-column product (``few_columns``) that convolutions over short signals
take: against a float64 product over shapes around its blocks (odd filter counts, odd and
even column counts, strided columns), and which products take it (by shape alone)."""

from __future__ import annotations

import numpy as np
import pytest

from onnxep.providers_cpu import jit
from onnxep.providers_cpu.ops import few_columns, nn_cpu

pytestmark = pytest.mark.skipif(not jit.ENABLED, reason="numba not available")


@pytest.mark.parametrize("m", [1, 3, 8, 129, 258])
@pytest.mark.parametrize("k", [1, 7, 64, 257, 388])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 6])
def test_product_against_float64(m, k, n):
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    w = rng.standard_normal((m, k)).astype(np.float32)
    wide = rng.standard_normal((k, 2 * n)).astype(np.float32)
    for cols in (np.ascontiguousarray(wide[:, :n]), wide[:, ::2]):  # contiguous and strided
        out = np.full((m, n), np.nan, np.float32)
        few_columns.product(w, cols, out)
        want = w.astype(np.float64) @ cols.astype(np.float64)
        tol = 2e-6 * np.abs(w).astype(np.float64) @ np.abs(cols).astype(np.float64) + 1e-6
        assert (np.abs(out - want) <= tol).all()


def test_nan_and_inf_propagate():
    w = np.ones((8, 300), np.float32) * 0.5
    cols = np.ones((300, 3), np.float32)
    cols[5, 1] = np.nan
    cols[7, 2] = np.inf
    out = np.empty((8, 3), np.float32)
    few_columns.product(w, cols, out)
    assert np.isfinite(out[:, 0]).all() and np.isnan(out[:, 1]).all()
    assert np.isposinf(out[:, 2]).all()


def test_which_products_take_it():
    big = np.zeros((128, 388), np.float32)
    assert few_columns.applies(big, 3)
    assert not few_columns.applies(big, 1)  # BLAS's GEMV is as fast
    assert not few_columns.applies(big, few_columns.MAX_COLUMNS + 1)
    assert not few_columns.applies(np.zeros((64, 193), np.float32), 2)  # too small to gain
    assert not few_columns.applies(big.astype(np.float64), 3)
    tuned = nn_cpu.TunedMatmul(big)
    cols = np.ones((388, 3), np.float32)
    assert not getattr(tuned.pick(cols), "plain", False)
    np.testing.assert_array_equal(tuned(cols), np.zeros((128, 3), np.float32))
    assert getattr(tuned.pick(np.ones((388, 1), np.float32)), "plain", False)


@pytest.mark.parametrize("images", [2, 3])
@pytest.mark.parametrize("n", [2, 3, 6])
def test_batch_of_images_each_as_alone(images, n):
    # A batch's columns take the loop image by image: each image's values are the bits it
    # gets alone (the 2-D route), whatever the batch size.
    rng = np.random.default_rng(images * 10 + n)
    w = rng.standard_normal((129, 388)).astype(np.float32)
    cols = rng.standard_normal((images, 388, n)).astype(np.float32)
    tuned = nn_cpu.TunedMatmul(w)
    got = tuned(cols)
    assert got.shape == (images, 129, n) and got.dtype == np.float32
    for i in range(images):
        np.testing.assert_array_equal(got[i], tuned(np.ascontiguousarray(cols[i])))
    want = w.astype(np.float64) @ cols.astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    # one column an image (BLAS's GEMV is as fast) and too many columns keep BLAS
    for width in (1, few_columns.MAX_COLUMNS + 1):
        f = tuned.pick(np.ones((images, 388, width), np.float32))
        assert "_few_columns_per_image" not in f.__qualname__
    assert "_few_columns_per_image" in tuned.pick(cols).__qualname__


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_batched_short_signal_conv_against_onnxruntime(batch):
    # silero VAD's encoder convs at the batch sizes of its exports (op18: 2, sequence: 3)
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    import onnxep

    rng = np.random.default_rng(batch)
    w = rng.standard_normal((128, 129, 3)).astype(np.float32) * 0.1
    b = rng.standard_normal(128).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1])
    relu = helper.make_node("Relu", ["c"], ["y"])
    graph = helper.make_graph(
        [node, relu],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 129, None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    data = model.SerializeToString()
    ours = onnxep.InferenceSession(data, providers=["cpu"])
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for length in (3, 4, 1):
        x = rng.standard_normal((batch, 129, length)).astype(np.float32)
        got = ours.run(None, {"x": x})[0]
        np.testing.assert_allclose(got, theirs.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
        for i in range(batch):  # each image as it comes out alone
            alone = ours.run(None, {"x": x[i : i + 1]})[0]
            np.testing.assert_allclose(got[i : i + 1], alone, rtol=1e-6, atol=1e-6)
