"""Softmax/LogSoftmax of small float32 inputs compiled (providers_cpu/ops/softmax_loops.py):
inputs whose rows are all finite in one call (``softmax_flat``, the compiled exp: within
tolerance of the NumPy kernel and of float64), the others with their reductions compiled
(the NumPy kernel's bits); onnx.reference's and onnxruntime's values."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import onnxep
from onnxep.providers_cpu import jit

pytest.importorskip("numba")
if not jit.ENABLED:
    pytest.skip("compiled loops off here (ONNXEP_CPU_JIT=0)", allow_module_level=True)
ort = pytest.importorskip("onnxruntime")


def _model(op, axis, opset, transpose=False):
    nodes = [helper.make_node(op, ["t" if transpose else "x"], ["y"], axis=axis)]
    if transpose:
        nodes.insert(0, helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _x(shape, seed=0, special=True):
    x = (np.random.default_rng(seed).normal(size=shape) * 6).astype(np.float32)
    if special and x.ndim >= 2 and x.shape[0] >= 4:
        rows = x.reshape(x.shape[0], -1)
        rows[1, 0] = np.nan
        rows[2, :] = -np.inf  # every element -inf: NaN out, as NumPy's kernel gives
        rows[3, 0] = np.inf
    return x


def _runs(model, x, monkeypatch):
    data = model.SerializeToString()
    with np.errstate(all="ignore"):
        fast = onnxep.InferenceSession(data, providers=["cpu"]).run(None, {"x": x})[0]
        with monkeypatch.context() as m:
            m.setattr(jit, "ENABLED", False)
            slow = onnxep.InferenceSession(data, providers=["cpu"]).run(None, {"x": x})[0]
    return fast, slow


CASES = [
    ((2, 1, 7), -1, 13),
    ((5, 160), -1, 13),
    ((6, 4, 5), 1, 11),  # opset 11: the dims from axis on, flattened
    ((6, 4, 5), -1, 11),
    ((4, 1), -1, 13),
    ((1, 4096), -1, 13),
    ((3, 129), -1, 13),  # pairwise sums: eight running sums, then halves
    ((2, 1000), -1, 13),
    ((3,), 0, 13),
]


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape, axis, opset", CASES)
def test_small_rows_against_numpy_reference_and_onnxruntime(op, shape, axis, opset, monkeypatch):
    model = _model(op, axis, opset)
    x = _x(shape)
    fast, slow = _runs(model, x, monkeypatch)
    assert fast.dtype == np.float32 and fast.shape == x.shape
    if np.isfinite(x).all():  # one compiled call: tolerance-level against NumPy's exp
        np.testing.assert_allclose(fast, slow, rtol=2e-5, atol=2e-6)
    else:  # a NaN or infinite row sends the call to the NumPy kernel's steps
        assert fast.tobytes() == slow.tobytes()  # NaN's bits too
    finite = np.isfinite(x).reshape(x.shape[0], -1).all(axis=1) if x.ndim > 1 else None
    ref = ReferenceEvaluator(model).run(None, {"x": x})[0]
    so = ort.SessionOptions()
    so.log_severity_level = 3
    theirs = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    want = theirs.run(None, {"x": x})[0]
    keep = (
        np.broadcast_to(finite.reshape((-1,) + (1,) * (x.ndim - 1)), x.shape)
        if finite is not None
        else np.ones(x.shape, bool)
    )
    if opset >= 13:  # onnx.reference's opset-11 kernels take the one axis, not the dims after it
        np.testing.assert_allclose(fast[keep], ref[keep], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(fast[keep], want[keep], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_large_inner_axis_and_strided_inputs_keep_numpy_bits(op, monkeypatch):
    # past MAX_SIZE and over a leading axis: the NumPy kernel, bit for bit (a large
    # Softmax takes the compiled exp only while every row's maximum is finite: these rows
    # hold +inf and -inf-only rows, so the whole call is NumPy's)
    from onnxep.providers_cpu.ops import softmax_loops

    big = _x((4, softmax_loops.MAX_SIZE // 4 + 1))
    fast, slow = _runs(_model(op, -1, 13), big, monkeypatch)
    np.testing.assert_array_equal(fast, slow)
    lead = _x((6, 4, 5))
    fast, slow = _runs(_model(op, 0, 13), lead, monkeypatch)
    np.testing.assert_array_equal(fast, slow)
    # a transposed (strided) input takes the one call on its C-order copy: the bits of the
    # same values fed contiguous
    x = _x((7, 9), special=False)
    fast, slow = _runs(_model(op, -1, 13, transpose=True), x, monkeypatch)
    np.testing.assert_allclose(fast, slow, rtol=2e-5, atol=2e-6)
    plain, _ = _runs(_model(op, -1, 13), np.ascontiguousarray(x.T), monkeypatch)
    assert fast.tobytes() == plain.tobytes()


def test_empty_and_float64_keep_numpy(monkeypatch):
    for x in (np.zeros((0, 5), np.float32), np.ones((2, 3), np.float64)):
        graph = helper.make_graph(
            [helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
            "g",
            [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), None)],
            [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(x.dtype), None)],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
        fast, slow = _runs(model, x, monkeypatch)
        assert fast.dtype == x.dtype and fast.shape == x.shape
        np.testing.assert_array_equal(fast, slow)


def _float64_softmax(x, k=1):
    rows = x.reshape(-1, int(np.prod(x.shape[x.ndim - k :]))).astype(np.float64)
    e = np.exp(rows - rows.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).reshape(x.shape)


@pytest.mark.parametrize(
    ("shape", "axis", "opset", "k"),
    [
        ((1, 10, 6625), -1, 13, 1),  # a text recogniser's classes
        ((3, 4097), -1, 13, 1),
        ((5000, 1), -1, 13, 1),  # rows of one value: 1 each
        ((2, 3, 1500), 1, 11, 2),  # opset 11: the trailing dims flattened
        ((9000, 3), -1, 13, 1),
    ],
)
def test_large_softmax_compiled_exp_against_float64_numpy_and_onnxruntime(
    shape, axis, opset, k, monkeypatch
):
    x = _x(shape, special=False) * np.float32(3)
    model = _model("Softmax", axis, opset)
    fast, slow = _runs(model, x, monkeypatch)
    assert fast.dtype == np.float32 and fast.shape == x.shape
    want = _float64_softmax(x, k)
    np.testing.assert_allclose(fast, want, rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(fast, slow, rtol=2e-5, atol=1e-7)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(fast, ref.run(None, {"x": x})[0], rtol=2e-5, atol=1e-7)


def test_large_softmax_special_values(monkeypatch):
    from onnxep.providers_cpu.ops import softmax_loops

    n = softmax_loops.MAX_SIZE // 4 + 1
    x = _x((5, n), special=False)
    x[0, 3] = np.nan  # a NaN row: all NaN, as NumPy's kernel gives
    x[1, :7] = -np.inf  # -inf entries in a finite row: 0
    x[2, 0] = 200.0  # the rest more than 88 below the maximum: 0, the maximum 1
    x[3, 5] = np.float32(-1e30)
    fast, slow = _runs(_model("Softmax", -1, 13), x, monkeypatch)
    assert np.isnan(fast[0]).all() and np.isnan(slow[0]).all()
    assert (fast[1, :7] == 0).all()
    assert fast[2, 0] == 1 and (fast[2, 1:] == 0).all()
    assert fast[3, 5] == 0
    np.testing.assert_allclose(fast[1:], slow[1:], rtol=2e-5, atol=1e-7)


def _float64_log_softmax(x, k=1):
    rows = x.reshape(-1, int(np.prod(x.shape[x.ndim - k :]))).astype(np.float64)
    s = rows - rows.max(axis=1, keepdims=True)
    return (s - np.log(np.exp(s).sum(axis=1, keepdims=True))).reshape(x.shape)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize(
    ("shape", "axis", "opset", "k"),
    [
        ((1, 4), -1, 13, 1),
        ((4,), 0, 13, 1),
        ((3, 5, 7), -1, 13, 1),
        ((2, 3, 4), 1, 11, 2),
        ((7, 1), -1, 13, 1),
        ((2, 2048), -1, 13, 1),
        ((1, 1, 1), -1, 13, 1),
    ],
)
def test_small_finite_rows_in_one_call_against_float64(op, shape, axis, opset, k, monkeypatch):
    from onnxep.providers_cpu.ops import softmax_loops

    calls = []
    real = softmax_loops.softmax_flat
    monkeypatch.setattr(softmax_loops, "softmax_flat", lambda *a: calls.append(a[2:]) or real(*a))
    x = _x(shape, seed=3, special=False)
    x.reshape(-1)[0] = np.float32(-1e30)  # exp underflows to 0: 0 out (LogSoftmax: -1e30 - max)
    model = _model(op, axis, opset)
    fast = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"]).run(
        None, {"x": x}
    )[0]
    cols = int(np.prod(shape[len(shape) - k :]))
    assert calls == [(cols, op == "LogSoftmax")]
    want = (_float64_softmax if op == "Softmax" else _float64_log_softmax)(x, k)
    np.testing.assert_allclose(fast, want, rtol=2e-6, atol=1e-7 if op == "Softmax" else 2e-6)
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(fast, theirs.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_small_rows_with_nan_or_inf_keep_the_numpy_steps(monkeypatch):
    # a row holding NaN or +inf, or only -inf, sends the whole call to the NumPy kernel's
    # steps, whose rules it needs; a -inf entry in a finite row stays in the one call (0 out)
    for op in ("Softmax", "LogSoftmax"):
        for bad in (np.nan, np.inf, "row"):
            x = _x((3, 6), seed=1, special=False)
            if bad == "row":
                x[1] = -np.inf
            else:
                x[2, 4] = bad
            fast, slow = _runs(_model(op, -1, 13), x, monkeypatch)
            assert fast.tobytes() == slow.tobytes()
        x = _x((3, 6), seed=1, special=False)
        x[0, 2] = -np.inf
        fast, slow = _runs(_model(op, -1, 13), x, monkeypatch)
        assert fast[0, 2] == (0 if op == "Softmax" else -np.inf)
        np.testing.assert_allclose(fast, slow, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("shape", [(1, 4, 64, 64), (1, 10, 6625), (3, 4097)])
def test_wide_rows_in_one_call(shape):
    # each row alone gives the bits it gives among the others (the rows are independent),
    # and the values are the float64 softmax's within the compiled exp's 2e-7
    from onnxep.providers_cpu.ops import softmax_loops

    x = _x(shape, seed=5, special=False) * np.float32(2)
    cols = shape[-1]
    flat = np.empty_like(x)
    assert softmax_loops.softmax_flat(x.ravel(), flat.ravel(), cols, False)
    x2 = x.reshape(-1, cols)
    last = np.empty(cols, np.float32)
    assert softmax_loops.softmax_flat(x2[-1].copy(), last, cols, False)
    assert flat.reshape(-1, cols)[-1].tobytes() == last.tobytes()
    x64 = x2.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    np.testing.assert_allclose(
        flat.reshape(-1, cols), e / e.sum(axis=1, keepdims=True), rtol=2e-6, atol=1e-9
    )
    log = np.empty_like(x)
    assert softmax_loops.softmax_flat(x.ravel(), log.ravel(), cols, True)
    np.testing.assert_allclose(log, _float64_log_softmax(x), rtol=1e-6, atol=2e-6)
