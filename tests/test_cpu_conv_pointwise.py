"""The few-positions pointwise kernel (``conv_pointwise``): its product against float64 over
odd shapes (channel counts off the panel width, positions off the tile, one position,
batches, no bias), NaN and infinity, the same bits on any thread split and through plans,
and 1x1 Conv / FusedConv sessions against onnxruntime and against the BLAS route."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper, numpy_helper

import onnxep
from onnxep.providers_cpu import jit
from onnxep.providers_cpu.ops import conv_pointwise as cp
from onnxep.providers_cpu.ops import nn_cpu, op_conv

pytestmark = pytest.mark.skipif(not jit.ENABLED, reason="numba not installed: no kernel")

# (N, M, C, L)
SHAPES = [
    (1, 7, 5, 1),
    (1, 1, 4, 1),
    (2, 33, 17, 13),
    (1, 768, 384, 6),
    (3, 20, 9, 5),
    (1, 96, 24, 7),
    (2, 200, 32, 48),
    (1, 17, 130, 12),
    (1, 50, 200, 1),
    (1, 70, 40, 64),
    (2, 33, 20, 49),
]


def _ref(w, b, x):
    y = np.einsum("mc,ncl->nml", w.astype(np.float64), x.astype(np.float64))
    return y if b is None else y + b.astype(np.float64)[:, None]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_product_matches_float64(shape, bias):
    n, m, c, length = shape
    rng = np.random.default_rng(0)
    w = rng.standard_normal((m, c)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32) if bias else None
    x = rng.standard_normal((n, c, length)).astype(np.float32)
    got = cp.product(w, b, x)
    want = _ref(w, b, x)
    assert got.shape == want.shape and got.dtype == np.float32
    scale = np.abs(w).max() * np.abs(x).max() * c + 1
    np.testing.assert_allclose(got, want, rtol=0, atol=4e-7 * scale)


def test_nan_and_infinity_propagate():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((40, 16)).astype(np.float32)
    x = rng.standard_normal((1, 16, 9)).astype(np.float32)
    x[0, 3, 2] = np.nan
    x[0, 5, 7] = np.inf
    got = cp.product(w, None, x)
    want = _ref(w, None, x)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(np.isinf(got), np.isinf(want))


@pytest.mark.parametrize("shape", [(2, 200, 32, 48), (1, 768, 384, 6), (1, 1280, 64, 1)], ids=str)
def test_thread_split_gives_the_same_bits(shape, monkeypatch):
    n, m, c, length = shape
    rng = np.random.default_rng(2)
    w = rng.standard_normal((m, c)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    x = rng.standard_normal((n, c, length)).astype(np.float32)
    one = cp.product(w, b, x)
    monkeypatch.setattr(nn_cpu, "run_threads", lambda: 2)
    monkeypatch.setattr(nn_cpu, "_PARALLEL_MIN", 0)
    two = cp.product(w, b, x)
    assert one.tobytes() == two.tobytes()


def test_shape_rule():
    assert cp.applies(16, 32, 48, np.float32, True)
    assert not cp.applies(16, 32, cp.max_positions() + 1, np.float32, True)
    assert cp.applies(16, 32, cp.max_positions(), np.float32, True)
    assert cp.max_positions() == (64 if cp.lanes() == 16 else 48)
    assert not cp.applies(16, 32, 6, np.float64, True)
    assert not cp.applies(16, 32, 6, np.float32, False)
    assert not cp.applies(2, 32, 6, np.float32, True)


def _model(cin, cout, hw, act=None, bias=True, batch=1):
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((cout, cin, 1, 1)) * 0.2).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    ins = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "b"))
        ins.append("b")
    nodes = [helper.make_node("Conv", ins, ["c" if act else "y"], kernel_shape=[1, 1])]
    if act == "HardSigmoid":
        nodes.append(helper.make_node(act, ["c"], ["y"], alpha=1 / 6, beta=0.5))
    elif act:
        nodes.append(helper.make_node(act, ["c"], ["y"]))
    model = make_model(
        nodes, [tensor("x", [batch, cin, *hw])], [tensor("y", None, TensorProto.FLOAT)], inits
    )
    return model.SerializeToString()


CASES = [
    (24, 96, (1, 1), "HardSigmoid", True, 2),
    (96, 24, (1, 1), "Relu", True, 2),
    (384, 768, (2, 3), None, True, 1),
    (192, 384, (4, 6), "HardSwish", True, 1),
    (32, 200, (2, 24), "HardSwish", False, 2),
    (512, 1280, (1, 1), None, True, 1),
    (7, 5, (3, 3), "Relu", True, 3),
    (64, 96, (7, 7), "HardSwish", True, 1),  # AVX-512 only (max_positions)
    (40, 24, (8, 8), None, True, 2),
]


@pytest.mark.parametrize("cin,cout,hw,act,bias,batch", CASES)
def test_sessions_match_onnxruntime_and_the_blas_route(
    cin, cout, hw, act, bias, batch, monkeypatch
):
    if hw[0] * hw[1] > cp.max_positions():
        pytest.skip("past this CPU's bound: BLAS")
    model = _model(cin, cout, hw, act, bias, batch)
    x = np.random.default_rng(4).standard_normal((batch, cin, *hw)).astype(np.float32)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    built = []
    real = cp.Pointwise
    monkeypatch.setattr(cp, "Pointwise", lambda *a: built.append(a) or real(*a))
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    got = [sess.run(None, {"x": x})[0] for _ in range(3)]  # the first run plans, then the plan
    assert len(built) == 1
    assert got[0].tobytes() == got[1].tobytes() == got[2].tobytes()
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(op_conv, "PLANS", False)
    unplanned = onnxep.InferenceSession(model, providers=["cpu"]).run(None, {"x": x})[0]
    assert unplanned.tobytes() == got[0].tobytes()
    monkeypatch.setattr(cp, "ENABLED", False)
    blas = onnxep.InferenceSession(model, providers=["cpu"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got[0], blas, rtol=1e-5, atol=1e-5)


def test_without_numba_the_blas_route_runs(monkeypatch):
    monkeypatch.setattr(jit, "ENABLED", False)
    monkeypatch.setattr(cp, "Pointwise", None)  # would fail if reached
    model = _model(24, 96, (1, 1), "HardSigmoid", True, 2)
    x = np.random.default_rng(5).standard_normal((2, 24, 1, 1)).astype(np.float32)
    got = onnxep.InferenceSession(model, providers=["cpu"]).run(None, {"x": x})[0]
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "name,params",
    [("Gelu", [1.4142135, 1.0, 0.5]), ("HardSwish", None), ("HardSigmoid", [0.2, 0.5]),
     ("Relu", None), ("Clip", [0.0, 6.0]), ("SiLU", None), ("LeakyRelu", [0.1])],
)  # fmt: skip
@pytest.mark.parametrize("shape", [(1, 768, 2, 3), (2, 4000, 1, 1), (1, 30, 1, 9000)], ids=str)
def test_the_compiled_activation_over_short_rows_has_the_numpy_bits(name, params, shape):
    """Outputs of short rows (few positions) run as one flat row: the same bits."""
    from onnxep.providers_cpu.ops.conv_epilogue import Epilogue

    y = (np.random.default_rng(6).standard_normal(shape) * 4).astype(np.float32)
    y.reshape(-1)[:4] = [np.nan, -0.0, np.inf, -np.inf]
    ep = Epilogue(name, params)
    got, want = y.copy(), y.copy()
    ep.apply(got)
    ep.numpy(want)
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("act", ["HardSwish", "Relu", "HardSigmoid", "LeakyRelu"])
@pytest.mark.parametrize("batch", [1, 2])
def test_wide_pointwise_bias_and_activation_in_one_pass_equal_the_unfused_graph(act, batch):
    """Maps past MAX_POSITIONS keep BLAS; the bias and the fused activation then go on in
    one compiled pass (``Epilogue.with_bias``): the unfused graph's bits."""
    model = _model(32, 64, (20, 20), act, True, batch)
    x = (np.random.default_rng(7).standard_normal((batch, 32, 20, 20)) * 3).astype(np.float32)
    x.reshape(-1)[:3] = [np.nan, np.inf, -np.inf]
    fused = onnxep.InferenceSession(model, providers=["cpu"])
    so = onnxep.SessionOptions(disabled_rewrites=["fuse_conv_activation"])
    plain = onnxep.InferenceSession(model, so, providers=["cpu"])
    for _ in range(2):  # the planned run, then the plan
        got = fused.run(None, {"x": x})[0]
        want = plain.run(None, {"x": x})[0]
        assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("threads_split", [False, True])
def test_wide_pointwise_runs_the_plain_product_into_its_output(threads_split, monkeypatch):
    """Where the tuner picks a one-thread split (row chunks, column blocks), the plan runs
    the plain product into its own output instead (the split's fresh array cost a copy);
    the same bits either way. A split for threads is still called."""
    from onnxep.providers_cpu.ops import nn_cpu

    calls = []

    def tune(self, cols):
        f = nn_cpu._col_blocked(self.w, 64, threads=threads_split)  # noqa: SLF001

        def g(c):
            calls.append(1)
            return f(c)

        g.one_thread_split = f.one_thread_split
        return g

    model = _model(16, 32, (16, 16), "HardSwish", True, 1)
    x = np.random.default_rng(8).standard_normal((1, 16, 16, 16)).astype(np.float32)
    plain = onnxep.InferenceSession(model, providers=["cpu"]).run(None, {"x": x})[0]
    monkeypatch.setattr(nn_cpu.TunedMatmul, "_tune", tune)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    got = [sess.run(None, {"x": x})[0] for _ in range(3)]
    assert (len(calls) > 0) == threads_split
    for g in got:
        assert g.tobytes() == plain.tobytes()
