"""Conv's per-input-shape run plans (``op_conv.PLANS``): a planned run gives the bits of
the general path (``PLANS`` off) on 1-D and 2-D convolutions with strides, pads,
dilations, groups, with and without a bias, each fused activation, float32 and float64,
batches, NaN inputs and inputs whose shape changes between runs, with the compiled loops
and without; the short-signal convs of the VAD models against onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper, numpy_helper

import onnxep
from onnxep.providers_cpu import jit
from onnxep.providers_cpu.ops import conv_pointwise, conv_short, nn_cpu, op_conv
from onnxep.providers_cpu.ops.conv_epilogue import Epilogue

_ELEM = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE}


def _model(cin, cout, k, dims, s=1, pads=(0, 0), d=1, g=1, bias=True, act="", dtype=np.float32):
    rng = np.random.default_rng(0)
    ks = [k] * dims
    w = (rng.standard_normal((cout, cin // g, *ks)) * 0.3).astype(dtype)
    inits = [numpy_helper.from_array(w, "w")]
    ins = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(cout).astype(dtype), "b"))
        ins.append("b")
    nodes = [
        helper.make_node(
            "Conv", ins, ["c" if act else "y"], kernel_shape=ks, strides=[s] * dims,
            pads=[pads[0]] * dims + [pads[1]] * dims, dilations=[d] * dims, group=g,
        )
    ]  # fmt: skip
    if act == "Clip":
        lo, hi = np.array(-0.5, dtype), np.array(0.7, dtype)
        inits += [numpy_helper.from_array(lo, "lo"), numpy_helper.from_array(hi, "hi")]
        nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["y"]))
    elif act:
        nodes.append(helper.make_node(act, ["c"], ["y"]))
    elem = _ELEM[dtype]
    shape = [None, cin, *([None] * dims)]
    m = make_model(nodes, [tensor("x", shape, elem)], [tensor("y", None, elem)], inits)
    return m.SerializeToString()


def _runs(model, shapes, dtype, monkeypatch, plans, threads=1):
    """Outputs of three runs per shape (the first builds the plan), NaN in the last."""
    monkeypatch.setattr(op_conv, "PLANS", plans)
    so = onnxep.SessionOptions(intra_op_num_threads=threads)
    sess = onnxep.InferenceSession(model, so, providers=["cpu"])
    outs = []
    for shape in shapes:
        for r in range(3):
            x = np.random.default_rng(r).standard_normal(shape).astype(dtype)
            if r == 2:
                x.reshape(-1)[:: max(1, x.size // 3)] = np.nan
                x.reshape(-1)[1] = -0.0
            outs.append(sess.run(None, {"x": x})[0])
    return outs


# (cin, cout, k, dims, stride, pads, dilation, group)
GEOMETRY = [
    (1, 33, 16, 1, 8, (0, 0), 1, 1),  # an STFT basis: long kernel, no pad
    (129, 128, 3, 1, 1, (1, 1), 1, 1),
    (128, 64, 3, 1, 2, (1, 1), 1, 1),
    (64, 64, 3, 1, 2, (1, 1), 1, 1),
    (64, 128, 3, 1, 1, (1, 1), 1, 1),
    (128, 1, 1, 1, 1, (0, 0), 1, 1),  # pointwise
    (16, 8, 5, 1, 1, (0, 2), 2, 1),  # end pad only, dilated
    (12, 6, 3, 1, 1, (1, 1), 1, 3),  # grouped: the general path
    (8, 16, 3, 2, 2, (1, 1), 1, 1),
    (8, 16, 5, 2, 1, (2, 2), 1, 1),  # 2-D stride 1: the timed wide/standard layout choice
    (8, 16, 3, 2, 1, (1, 1), 1, 1),  # 3x3 stride 1: kept off plans (Winograd by threads)
    (6, 4, 1, 2, 1, (0, 0), 1, 1),  # pointwise 2-D
    (6, 4, 2, 2, 2, (0, 0), 1, 1),  # unpadded 2-D
    (32, 32, 3, 2, 1, (1, 1), 1, 32),  # depthwise: the channels-last loop (numba)
    (48, 96, 3, 2, 2, (1, 1), 1, 48),  # depthwise, multiplier 2: the flat-plane loop
    (40, 40, 5, 2, 1, (2, 2), 2, 40),
]
# Input lengths (1-D) or sides (2-D), run in turn: each keeps its own plan.
LENGTHS = {1: (4, 9, 4), 2: (7, 5, 7)}


@pytest.mark.parametrize("act", ["", "Relu", "Clip", "HardSigmoid", "LeakyRelu"])
@pytest.mark.parametrize("geo", GEOMETRY, ids=[str(g) for g in GEOMETRY])
def test_planned_runs_equal_the_general_path(geo, act, monkeypatch):
    cin, cout, k, dims, s, pads, d, g = geo
    for bias, dtype, batch in (
        (True, np.float32, 1),
        (False, np.float64, 1),
        (True, np.float32, 2),
    ):
        model = _model(cin, cout, k, dims, s, pads, d, g, bias, act, dtype)
        shapes = [(batch, cin, *([n + k * d] * dims)) for n in LENGTHS[dims]]
        want = _runs(model, shapes, dtype, monkeypatch, plans=False)
        got = _runs(model, shapes, dtype, monkeypatch, plans=True)
        for a, b in zip(got, want):
            assert a.shape == b.shape and a.dtype == b.dtype
            assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("compiled", [True, False], ids=["numba", "numpy"])
@pytest.mark.parametrize("threads", [1, 2])
def test_planned_runs_equal_the_general_path_with_and_without_numba(compiled, threads, monkeypatch):
    if compiled and not jit.ENABLED:
        pytest.skip("numba not installed")
    monkeypatch.setattr(jit, "ENABLED", compiled)
    for cin, cout, k, dims, s, pads, d, g in GEOMETRY[:6] + GEOMETRY[8:]:
        model = _model(cin, cout, k, dims, s, pads, d, g, True, "Relu")
        shapes = [(1, cin, *([n + k] * dims)) for n in LENGTHS[dims]]
        want = _runs(model, shapes, np.float32, monkeypatch, False, threads)
        got = _runs(model, shapes, np.float32, monkeypatch, True, threads)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(got, want))


def test_a_planned_run_makes_no_decision_again(monkeypatch):
    """After a shape's first run, its runs go through the plan: no GEMM tuning lookup."""
    # the BLAS route's plans (few positions take conv_pointwise's and conv_short's kernels:
    # their own tests)
    monkeypatch.setattr(conv_pointwise, "ENABLED", False)
    monkeypatch.setattr(conv_short, "ENABLED", False)
    calls = []
    pick = nn_cpu.TunedMatmul.pick
    monkeypatch.setattr(
        nn_cpu.TunedMatmul, "pick", lambda self, c: calls.append(1) or pick(self, c)
    )
    for geo in ((129, 128, 3, 1, 1, (1, 1)), (1, 33, 16, 1, 8, (0, 0)), (128, 1, 1, 1, 1, (0, 0))):
        model = _model(*geo, act="Relu")
        sess = onnxep.InferenceSession(model, providers=["cpu"])
        calls.clear()
        for n in (4, 4, 4, 9, 9, 4):
            sess.run(None, {"x": np.ones((1, geo[0], n + geo[2]), np.float32)})
        assert len(calls) == 2  # once per input shape


def test_a_depthwise_run_is_planned_once_per_shape(monkeypatch):
    if not jit.ENABLED:
        pytest.skip("numba not installed: the depthwise loop is the NumPy path's")
    made = []
    real = op_conv.depthwise_2d_runner
    monkeypatch.setattr(op_conv, "depthwise_2d_runner", lambda *a: made.append(1) or real(*a))
    sess = onnxep.InferenceSession(_model(32, 32, 3, 2, g=32, pads=(1, 1), act="Relu"))
    for hw in (7, 7, 7, 9, 7, 9):
        sess.run(None, {"x": np.ones((1, 32, hw, hw), np.float32)})
    assert len(made) == 2


def _fused_conv_with_z(xs, ws, group, dtype=np.float32):
    rng = np.random.default_rng(4)
    w = (rng.standard_normal(ws) * 0.3).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    dims = len(xs) - 2
    node = helper.make_node(
        "FusedConv", ["x", "w", "b", "z"], ["y"], domain="com.microsoft", activation="Relu",
        kernel_shape=[3] * dims, pads=[1] * (2 * dims), group=group,
    )  # fmt: skip
    elem = _ELEM[dtype]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    m = make_model(
        [node],
        [tensor("x", list(xs), elem), tensor("z", [xs[0], ws[0], *xs[2:]], elem)],
        [tensor("y", None, elem)],
        inits,
        extra_opsets=[("com.microsoft", 1)],
    )
    return m.SerializeToString()


@pytest.mark.parametrize(
    "xs,ws,group",
    [((1, 5, 6), (8, 5, 3), 1), ((1, 32, 7, 7), (32, 1, 3, 3), 32)],
    ids=["conv1d", "depthwise"],
)
def test_fused_conv_with_z_adds_before_the_activation(xs, ws, group, monkeypatch):
    """Z goes on before the activation on every run, planned or not (the depthwise loop
    applies the activation itself, so its plan is kept for nodes without Z only)."""
    model = _fused_conv_with_z(xs, ws, group)
    rng = np.random.default_rng(5)
    zs = (xs[0], ws[0], *xs[2:])
    feeds = [
        {
            "x": rng.standard_normal(xs).astype(np.float32),
            "z": (rng.standard_normal(zs) * (i % 2) * 3).astype(np.float32),
        }
        for i in range(4)
    ]
    outs = {}
    for plans in (False, True):
        monkeypatch.setattr(op_conv, "PLANS", plans)
        sess = onnxep.InferenceSession(model, providers=["cpu"])
        outs[plans] = [sess.run(None, f)[0] for f in feeds]
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for a, b, f in zip(outs[True], outs[False], feeds):
        assert a.tobytes() == b.tobytes()
        np.testing.assert_allclose(a, want.run(None, f)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "name,params", [("Relu", None), ("Clip", [-0.5, 0.7]), ("Clip", [0.0, 6.0])]
)
def test_small_output_activation_has_apply_bits(name, params, dtype):
    """``Epilogue.inplace``'s one-ufunc Relu and Clip give ``apply``'s bits, corners included."""
    ep = Epilogue(name, params)
    corners = [np.nan, -np.nan, -0.0, 0.0, np.inf, -np.inf, 1e-45, -1e-45, 0.7, -0.5, 6.0]
    vals = np.random.default_rng(6).standard_normal(200) * 3
    y = np.concatenate([corners, vals]).astype(dtype).reshape(1, -1, 1)
    want = y.copy()
    ep.apply(want)
    f = ep.inplace(y.size, dtype)
    assert f != ep.apply  # the one-ufunc form, not apply itself
    got = y.copy()
    f(got)
    assert got.tobytes() == want.tobytes()
    assert ep.inplace(1 << 20, dtype) == ep.apply  # large outputs: apply's own paths


# The silero/akiki VAD encoders' convs: (cin, cout, k, stride, pads, length, act)
VAD = [
    (1, 258, 256, 128, (0, 0), 576, ""),
    (129, 128, 3, 1, (1, 1), 4, "Relu"),
    (128, 64, 3, 2, (1, 1), 4, "Relu"),
    (64, 64, 3, 2, (1, 1), 2, "Relu"),
    (64, 128, 3, 1, (1, 1), 1, "Relu"),
    (128, 1, 1, 1, (0, 0), 1, "Sigmoid"),
]


@pytest.mark.parametrize("cin,cout,k,s,pads,length,act", VAD)
def test_vad_convs_match_onnxruntime(cin, cout, k, s, pads, length, act):
    model = _model(cin, cout, k, 1, s, pads, 1, 1, k < 64, act)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for r in range(3):
        x = np.random.default_rng(r).standard_normal((1, cin, length)).astype(np.float32)
        got, want = sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1, np.abs(want).max()))
