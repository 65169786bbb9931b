"""MatMul, Gemm and the LSTM/GRU input projections on the compiled GEMM
(``providers_cpu/ops/weight_gemm.py``) against float64 NumPy and the OpenBLAS path.

The product alone over odd M, N, K (not multiples of the kernel's block, fewer rows than a
panel, K past one block, zero rows), W as given and transposed, a bias row, into a given
buffer; its bits the same on one thread and two; through sessions: MatMul with batch
dimensions, Gemm's transA/transB/alpha/beta/C shapes, shapes and dtypes that keep BLAS, an
LSTM and a GRU against the switch off; the rule (sessions of one thread keep OpenBLAS where
the rule is ``threads``) and the providers line.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxep
from onnxep.providers_cpu import jit
from onnxep.providers_cpu.ops import conv_gemm, shared_weights, weight_gemm
from onnxep.providers_cpu.threads import blas_threads

needs_jit = pytest.mark.skipif(not jit.ENABLED, reason="numba not installed: no compiled GEMM")


def _gemm(w, trans):
    return weight_gemm.WeightGemm(shared_weights.SharedWeight(np.ascontiguousarray(w)), trans)


@needs_jit
@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize(
    "m,k,n",
    [(1, 8, 16), (5, 9, 17), (6, 16, 16), (7, 33, 13), (13, 600, 49), (12, 128, 130), (0, 9, 20)],
)
def test_product_matches_float64(m, k, n, trans):
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    w = rng.standard_normal((n, k) if trans else (k, n)).astype(np.float32)
    a = rng.standard_normal((m, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    g = _gemm(w, trans)
    wk = (w.T if trans else w).astype(np.float64)
    for b in (None, bias):
        y = g(a, b)
        want = a.astype(np.float64) @ wk + (0 if b is None else b.astype(np.float64))
        assert y.shape == (m, n) and y.dtype == np.float32
        np.testing.assert_allclose(y, want, rtol=0, atol=4e-5 * max(1.0, np.sqrt(k)))
    out = np.full((m, n), np.nan, np.float32)
    assert g(a, bias, out=out) is out
    np.testing.assert_array_equal(out, g(a, bias))


@needs_jit
def test_a_strided_input_is_copied_not_misread():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((40, 30)).astype(np.float32)
    big = rng.standard_normal((23, 50)).astype(np.float32)
    a = big[:, 5:45]  # rows 50 apart
    got = _gemm(w, False)(a)
    np.testing.assert_allclose(got, a.astype(np.float64) @ w, rtol=0, atol=1e-4)


@needs_jit
def test_bits_do_not_depend_on_the_thread_count(monkeypatch):
    monkeypatch.setattr("onnxep.providers_cpu.ops.nn_cpu._PARALLEL_MIN", 0)
    monkeypatch.setattr(weight_gemm, "_A_BLOCK_BYTES", 4 * 600 * 6)  # one panel a block
    rng = np.random.default_rng(2)
    w = rng.standard_normal((600, 211)).astype(np.float32)
    a = rng.standard_normal((53, 600)).astype(np.float32)
    g = _gemm(w, False)
    with blas_threads(1):
        one = g(a)
    with blas_threads(2):
        two = g(a)
    assert np.array_equal(one.view(np.uint32), two.view(np.uint32))


@needs_jit
def test_nan_and_inf_propagate_to_their_columns_only():
    w = np.ones((20, 37), np.float32)
    w[3, 5] = np.nan
    w[0, 36] = np.inf
    y = _gemm(w, False)(np.ones((9, 20), np.float32))
    assert np.isnan(y[:, 5]).all() and np.isposinf(y[:, 36]).all()
    assert np.isfinite(np.delete(y, [5, 36], axis=1)).all()


def _model(nodes, inputs, inits, opset=17):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _run(model, feeds, threads=2):
    so = onnxep.SessionOptions(intra_op_num_threads=threads)
    sess = onnxep.InferenceSession(model.SerializeToString(), so, providers=["cpu"])
    return sess.run(None, feeds)[0]


def _spy(monkeypatch) -> list:
    calls = []
    real = weight_gemm.WeightGemm.__call__

    def spy(self, a, *args, **kw):
        calls.append(a.shape)
        return real(self, a, *args, **kw)

    monkeypatch.setattr(weight_gemm.WeightGemm, "__call__", spy)
    return calls


@pytest.fixture
def small(monkeypatch):
    """The cases are small, to stay fast: no size floor."""
    monkeypatch.setattr(weight_gemm, "MIN_MACS", 0)


MATMUL = {
    "2-D": ((19, 40), (40, 33)),
    "batch dims": ((2, 3, 7, 24), (24, 50)),
    "one leading dim": ((1, 13, 64), (64, 17)),
    "zero rows": ((0, 40), (40, 33)),
    "zero batch": ((0, 5, 40), (40, 33)),
}


@pytest.mark.parametrize("case", list(MATMUL), ids=list(MATMUL))
@pytest.mark.parametrize("mode", ["1", "0"])
def test_matmul_matches_numpy(case, mode, small, monkeypatch):
    if mode == "1" and not jit.ENABLED:
        pytest.skip("numba not installed: no compiled GEMM")
    monkeypatch.setattr(weight_gemm, "MODE", mode)
    calls = _spy(monkeypatch)
    ashape, wshape = MATMUL[case]
    rng = np.random.default_rng(len(case))
    w = rng.standard_normal(wshape).astype(np.float32)
    a = rng.standard_normal(ashape).astype(np.float32)
    model = _model([helper.make_node("MatMul", ["a", "w"], ["y"])], [("a", ashape)], {"w": w})
    got = _run(model, {"a": a})
    want = a.astype(np.float64) @ w
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    rows = int(np.prod(ashape[:-1]))
    # a few rows (at most 8) run few_rows.py's loop, as before
    assert bool(calls) == (mode == "1" and rows > 8)


GEMM = {
    "transB, bias row": dict(m=17, k=40, n=30, transB=1, c=(30,)),
    "W as given, bias (1, N)": dict(m=17, k=40, n=30, c=(1, 30)),
    "transA": dict(m=17, k=40, n=30, transA=1, transB=1, c=(30,)),
    "alpha and beta": dict(m=11, k=20, n=45, transB=1, alpha=0.5, beta=2.0, c=(45,)),
    "C (M, N)": dict(m=11, k=20, n=45, c=(11, 45)),
    "C a scalar": dict(m=11, k=20, n=45, transB=1, c=()),
    "no C": dict(m=11, k=20, n=45, transB=1, c=None),
}


@pytest.mark.parametrize("case", list(GEMM), ids=list(GEMM))
@pytest.mark.parametrize("mode", ["1", "0"])
def test_gemm_matches_numpy(case, mode, small, monkeypatch):
    if mode == "1" and not jit.ENABLED:
        pytest.skip("numba not installed: no compiled GEMM")
    monkeypatch.setattr(weight_gemm, "MODE", mode)
    calls = _spy(monkeypatch)
    p = dict(GEMM[case])
    m, k, n, cshape = p.pop("m"), p.pop("k"), p.pop("n"), p.pop("c")
    rng = np.random.default_rng(m + k + n)
    trans_a, trans_b = p.get("transA", 0), p.get("transB", 0)
    w = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
    inits = {"w": w}
    names = ["a", "w"]
    if cshape is not None:
        inits["c"] = rng.standard_normal(cshape).astype(np.float32)
        names.append("c")
    model = _model([helper.make_node("Gemm", names, ["y"], **p)], [("a", a.shape)], inits, 13)
    got = _run(model, {"a": a})
    am = (a.T if trans_a else a).astype(np.float64)
    want = p.get("alpha", 1.0) * (am @ (w.T if trans_b else w))
    if cshape is not None:
        want = want + p.get("beta", 1.0) * inits["c"].astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    assert bool(calls) == (mode == "1")


def test_shapes_and_dtypes_that_keep_blas(small, monkeypatch):
    monkeypatch.setattr(weight_gemm, "MODE", "1")
    calls = _spy(monkeypatch)
    rng = np.random.default_rng(5)
    # float64, a fed weight, N under 16, K under 8
    cases = []
    w64 = rng.standard_normal((30, 20))
    cases.append((_model_d(w64), {"a": rng.standard_normal((12, 30))}))
    fed = _model(
        [helper.make_node("MatMul", ["a", "w"], ["y"])], [("a", (12, 30)), ("w", (30, 20))], {}
    )
    cases.append((fed, {"a": _f32(rng, (12, 30)), "w": _f32(rng, (30, 20))}))
    for k, n in ((30, 9), (5, 40)):
        mod = _model(
            [helper.make_node("MatMul", ["a", "w"], ["y"])],
            [("a", (12, k))],
            {"w": _f32(rng, (k, n))},
        )
        cases.append((mod, {"a": _f32(rng, (12, k))}))
    for model, feeds in cases:
        got = _run(model, feeds)
        want = feeds["a"].astype(np.float64) @ (feeds.get("w") if "w" in feeds else _init(model))
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    assert calls == []


def _f32(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def _init(model):
    return numpy_helper.to_array(model.graph.initializer[0]).astype(np.float64)


def _model_d(w):
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("a", TensorProto.DOUBLE, [12, w.shape[0]])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)],
        [numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@needs_jit
@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_recurrent_input_projection(op, small, monkeypatch):
    calls = _spy(monkeypatch)
    rng = np.random.default_rng(7)
    t, b, i, h = 6, 2, 24, 16
    gates = 4 if op == "LSTM" else 3
    inits = {
        "W": (rng.standard_normal((2, gates * h, i)) * 0.3).astype(np.float32),
        "R": (rng.standard_normal((2, gates * h, h)) * 0.3).astype(np.float32),
        "B": (rng.standard_normal((2, 2 * gates * h)) * 0.1).astype(np.float32),
    }
    node = helper.make_node(
        op, ["x", "W", "R", "B"], ["y"], hidden_size=h, direction="bidirectional"
    )
    model = _model([node], [("x", (t, b, i))], inits)
    x = rng.standard_normal((t, b, i)).astype(np.float32)
    monkeypatch.setattr(weight_gemm, "MODE", "0")
    blas = _run(model, {"x": x})
    assert calls == []
    monkeypatch.setattr(weight_gemm, "MODE", "1")
    ours = _run(model, {"x": x})
    assert calls  # one product a direction
    np.testing.assert_allclose(ours, blas, rtol=0, atol=1e-5)
    assert np.array_equal(_run(model, {"x": x}, 1).view(np.uint32), ours.view(np.uint32))


@needs_jit
def test_the_threads_rule_keeps_openblas_at_one_thread(small, monkeypatch):
    monkeypatch.setattr(weight_gemm, "MODE", "auto")
    monkeypatch.setattr(conv_gemm, "_auto", "threads")
    calls = _spy(monkeypatch)
    rng = np.random.default_rng(9)
    w = _f32(rng, (64, 48))
    model = _model([helper.make_node("MatMul", ["a", "w"], ["y"])], [("a", (20, 64))], {"w": w})
    a = _f32(rng, (20, 64))
    for threads in (1, 2):
        calls.clear()
        got = _run(model, {"a": a}, threads)
        np.testing.assert_allclose(got, a.astype(np.float64) @ w, rtol=0, atol=1e-4)
        assert bool(calls) == (threads == 2)
    assert weight_gemm.runs_at(2) and not weight_gemm.runs_at(1)
    monkeypatch.setattr(conv_gemm, "_auto", "")
    assert not weight_gemm.runs_at(2)


def test_the_provider_says_which_gemm_runs(monkeypatch):
    from onnxep.providers_cpu.plugin import CPUPlugin

    desc = CPUPlugin().onnxep_provider_info().description
    assert weight_gemm.status() in desc
    monkeypatch.setattr(weight_gemm, "MODE", "0")
    assert "OpenBLAS" in weight_gemm.status() and weight_gemm.session_notes(2) == ()
    monkeypatch.setattr(jit, "ENABLED", False)
    monkeypatch.setattr(weight_gemm, "MODE", "1")
    assert not weight_gemm.runs_at(2)
