"""Products of a few rows (providers_cpu/ops/few_rows.py) and weights shared between
nodes (shared_weights.py), with the compiled loop and without it.

The compiled loop must give the product to float rounding for every row count, column
count (whole blocks of four and a cut one) and dtype, the same bits whatever the
thread split, and NaN/infinity where BLAS gives them; sessions must give the same bits
with the weights as constants or as fed inputs, and onnxruntime's values.
"""

from __future__ import annotations

import gc

import numpy as np
import onnx
import pytest
from onnx import helper

import onnxep
from onnxep.providers_cpu import jit
from onnxep.providers_cpu.ops import few_rows, nn_cpu, shared_weights
from onnxep.testing import compare_output

ort = pytest.importorskip("onnxruntime")


def _rtol(dtype) -> float:
    return 2e-5 if dtype == np.float32 else 1e-12


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m", [1, 2, 3, 5, 8])
def test_products_match_float64(compiled, m, dtype):
    rng = np.random.default_rng(m)
    k, n = 300, 398  # 398 columns: the last block of four is cut at two
    a = rng.standard_normal((m, k)).astype(dtype)
    w = rng.standard_normal((n, k)).astype(dtype)
    want = a.astype(np.float64) @ w.T.astype(np.float64)
    assert few_rows.fits(a, w, 1) == (m <= (8 if compiled else 3))
    for y in (
        few_rows.rows_times_transposed(a, w),
        few_rows.rows_times(a, np.ascontiguousarray(w.T)),
        few_rows.rows_times(a, np.ascontiguousarray(w.T), w if compiled else None),
    ):
        assert y.dtype == dtype and y.shape == (m, n)
        np.testing.assert_allclose(y, want, rtol=_rtol(dtype), atol=_rtol(dtype) * np.sqrt(k))


def test_rows_beyond_the_limit_do_not_fit(compiled):
    w = np.zeros((400, 100), np.float32)
    assert few_rows.fits(np.zeros((8 if compiled else 3, 100), np.float32), w, 1)
    assert not few_rows.fits(np.zeros((9 if compiled else 4, 100), np.float32), w, 1)
    assert not few_rows.fits(np.zeros((2, 100), np.float32), w[:, :50], 1)  # K differs
    assert not few_rows.fits(np.zeros((2, 100), np.float64), w, 1)  # dtypes differ
    assert not few_rows.fits(np.zeros((2, 10), np.float32), w[:10, :10], 1)  # tiny weight


@pytest.mark.parametrize("threads", [2, 3, 5])
def test_thread_split_gives_the_same_bits(monkeypatch, threads):
    if not jit.ENABLED:
        pytest.skip("numba not installed: no compiled loop")
    rng = np.random.default_rng(7)
    a = rng.standard_normal((6, 512)).astype(np.float32)
    w = rng.standard_normal((1001, 512)).astype(np.float32)
    monkeypatch.setattr(few_rows, "SPLIT_MIN", 0)  # split this small product too
    monkeypatch.setattr(nn_cpu, "run_threads", lambda: 1)
    one = few_rows.rows_times_transposed(a, w)
    monkeypatch.setattr(nn_cpu, "run_threads", lambda: threads)
    assert few_rows.rows_times_transposed(a, w).tobytes() == one.tobytes()


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_nan_and_infinity_propagate(compiled):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((3, 256)).astype(np.float32)
    w = rng.standard_normal((200, 256)).astype(np.float32)
    a[0, 5] = np.nan
    a[1, 7] = np.inf
    w[3, 9] = -np.inf
    y = few_rows.rows_times_transposed(a, w)
    want = a.astype(np.float64) @ w.T.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(y), np.isinf(want))
    assert np.isnan(y[0]).all()


# -- shared weights ------------------------------------------------------------------------


def test_equal_weights_share_one_copy_and_one_transpose():
    rng = np.random.default_rng(4)
    w = rng.standard_normal((300, 200)).astype(np.float32)
    first = shared_weights.shared(w)
    again = shared_weights.shared(w.copy())
    assert again is first
    assert again.transposed is first.transposed
    np.testing.assert_array_equal(first.transposed, w.T)
    assert first.transposed.flags.c_contiguous


def test_weights_alike_in_the_sample_do_not_share():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((300, 200)).astype(np.float32)
    other = w.copy()
    other[1, 1] += 1.0  # between the sampled values: the key is the same
    assert shared_weights.sample_key(w) == shared_weights.sample_key(other)
    a, b = shared_weights.shared(w), shared_weights.shared(other)
    assert a is not b
    np.testing.assert_array_equal(b.array, other)
    # -0.0 and 0.0 are equal values but other bytes: not one weight
    z = np.zeros((4, 4), np.float32)
    assert shared_weights.shared(z) is not shared_weights.shared(-z)
    assert shared_weights.shared(z.astype(np.float64)).array.dtype == np.float64


def test_a_shared_weight_lives_as_long_as_a_user():
    w = np.random.default_rng(6).standard_normal((64, 64)).astype(np.float32)
    s = shared_weights.shared(w)
    ident = id(s)
    assert id(shared_weights.shared(w)) == ident
    del s
    gc.collect()
    fresh = shared_weights.shared(w)
    np.testing.assert_array_equal(fresh.array, w)


# -- sessions ---------------------------------------------------------------------------


def _model(op: str, k: int, n: int, **attrs) -> onnx.ModelProto:
    rng = np.random.default_rng(k + n)
    if op == "Gemm":
        # weights as an initialiser draws them, so sums do not cancel to nothing
        b = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
        c = rng.standard_normal((n,)).astype(np.float32)
        # two nodes on one initializer, as an unrolled RNN's steps
        nodes = [
            helper.make_node("Gemm", ["a", "w", "c"], ["t"], transB=1, **attrs),
            helper.make_node("Gemm", ["a2", "w", "c"], ["u"], transB=1, **attrs),
            helper.make_node("Add", ["t", "u"], ["y"]),
        ]
        inits = [onnx.numpy_helper.from_array(b, "w"), onnx.numpy_helper.from_array(c, "c")]
        a_shape = [k, None] if attrs.get("transA") else [None, k]
        inputs = [
            helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, a_shape),
            helper.make_tensor_value_info("a2", onnx.TensorProto.FLOAT, a_shape),
        ]
    else:
        b = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
        nodes = [
            helper.make_node("MatMul", ["a", "w"], ["t"]),
            helper.make_node("MatMul", ["a2", "w"], ["u"]),
            helper.make_node("Add", ["t", "u"], ["y"]),
        ]
        inits = [onnx.numpy_helper.from_array(b, "w")]
        inputs = [
            helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [None, None, k]),
            helper.make_tensor_value_info("a2", onnx.TensorProto.FLOAT, [None, None, k]),
        ]
    graph = helper.make_graph(
        nodes, "g", inputs, [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def _as_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for init in m.graph.initializer:
        m.graph.input.append(
            helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
        )
    return m


def _feeds(op: str, rows: tuple, k: int, trans_a: bool, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    if op == "Gemm":
        shape = (k, rows[0]) if trans_a else (rows[0], k)
    else:
        shape = (*rows, k)
    return {x: rng.standard_normal(shape).astype(np.float32) for x in ("a", "a2")}


@pytest.mark.parametrize(
    ("op", "attrs"),
    [("Gemm", {}), ("Gemm", dict(alpha=0.5, beta=2.0, transA=1)), ("MatMul", {})],
    ids=["gemm", "gemm-alpha-beta-transA", "matmul"],
)
def test_constant_and_fed_weights_give_the_same_bits(compiled, op, attrs):
    k, n = 256, 301
    model = _model(op, k, n, **attrs)
    ours = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    fed = onnxep.InferenceSession(_as_inputs(model).SerializeToString(), providers=["cpu"])
    peer = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    shapes = (
        [(1,), (2,), (3,), (4,), (7,), (8,), (9,)]
        if op == "Gemm"
        else [(1, 2), (2, 3), (1, 8), (3, 3)]
    )
    for i, rows in enumerate(shapes):
        feeds = _feeds(op, rows, k, bool(attrs.get("transA")), i)
        got = ours.run(None, feeds)[0]
        assert got.tobytes() == fed.run(None, feeds)[0].tobytes(), rows
        want = peer.run(None, feeds)[0]
        bad = [r.describe() for r in compare_output("y", got, want, "cpu", "ort") if not r.ok]
        assert not bad, rows
