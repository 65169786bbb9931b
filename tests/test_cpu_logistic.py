"""The CPU's float32 logistic without libm's exp (``providers_cpu/ops/logistic.py``, the loop
``jit._logistic_value``): its error over the float32 range against a float64 sigmoid, the
values 1 / (1 + exp(-x)) gives at NaN, infinities, zeros and large |x|, shapes (empty,
0-d, non-contiguous, in place, any run thread count), and the ops that use it (Sigmoid,
onnxep::SiLU, com.microsoft QuickGelu, Swish, FusedConv's Sigmoid/SiLU) through sessions
against onnxruntime, with the compiled loop and with NumPy alone."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper, numpy_helper

import onnxep
from onnxep.providers_cpu import jit
from onnxep.providers_cpu.ops import logistic as lg

H = helper.make_node
ELEM = {
    np.float32: TensorProto.FLOAT,
    np.float64: TensorProto.DOUBLE,
    np.float16: TensorProto.FLOAT16,
}
# Largest error against the exact sigmoid: this loop's measured 9e-8 over every float32
# (MLAS's approximation in onnxruntime: 1.7e-7); one float32 ulp below 1 is 6e-8.
ABS_TOL = 1.2e-7

needs_numba = pytest.mark.skipif(not jit.ENABLED, reason="numba not installed")


def _exact(x: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    w = np.float32(alpha) * x.astype(np.float32)
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-w.astype(np.float64)))


def _float32_sweep(step: int = 997) -> np.ndarray:
    """Every ``step``-th float32 bit pattern, NaNs left out: the whole range, both signs."""
    bits = np.arange(0, 1 << 32, step, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    return x[~np.isnan(x)]


def _formula32(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) in float32, as NumPy rounds it."""
    with np.errstate(over="ignore"):
        return np.float32(1) / (np.float32(1) + np.exp(-x))


@needs_numba
def test_error_over_the_float32_range():
    x = _float32_sweep()
    got = lg.logistic(x)
    want = _exact(x)
    err = np.abs(got - want)
    assert err.max() <= ABS_TOL, (x[err.argmax()], err.max())
    # small results keep their relative accuracy (u / (1 + u), no 1 - s): a few ulps
    # wherever the result is a normal float32
    small = (want < 0.25) & (want >= np.finfo(np.float32).tiny)
    rel = err[small] / want[small]
    assert rel.max() <= 4 * np.finfo(np.float32).eps, x[small][rel.argmax()]


@needs_numba
def test_error_near_zero_and_the_tails():
    x = np.concatenate(
        [
            np.linspace(-20, 20, 400_001, dtype=np.float32),
            np.linspace(-90, 90, 20_001, dtype=np.float32),
        ]
    )
    for alpha in (1.0, 1.702):
        got = lg.logistic(x, alpha)
        assert np.abs(got - _exact(x, alpha)).max() <= ABS_TOL, alpha


@needs_numba
def test_silu_product_is_x_times_the_rounded_sigmoid():
    x = (np.random.default_rng(0).standard_normal(10_000) * 10).astype(np.float32)
    s = lg.logistic(x)
    assert lg.logistic(x, mul=True).tobytes() == (x * s).tobytes()
    xa = np.float32(1.702) * x
    assert lg.logistic(x, 1.702, mul=True).tobytes() == (x * lg.logistic(xa)).tobytes()


@pytest.mark.usefixtures("compiled")
def test_specials_as_the_formula_gives_them():
    low = np.float32(-88.72283)  # exp(-x) is float32's largest finite exponential
    below = np.nextafter(low, np.float32(-np.inf))
    x = np.array(
        [
            np.nan,
            -np.nan,
            np.inf,
            -np.inf,
            0.0,
            -0.0,
            17.0,
            30.0,
            1e30,
            np.finfo(np.float32).max,
            -1e30,
            -np.finfo(np.float32).max,
            -100.0,
            below,
            low,
            -88.0,
            -87.0,
            1e-40,
            -1e-40,
        ],
        np.float32,
    )
    got = lg.logistic(x)
    want = _formula32(x)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    # exact where the formula saturates or is exact; the subnormal tail to within its ulp
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6, atol=1e-44)
    assert got[2] == 1 and got[3] == 0 and got[4] == 0.5 and got[5] == 0.5
    assert got[6] == want[6] and np.all(got[7:10] == 1)
    assert np.all(got[10:14] == 0)  # below -88.72283, as exp(-x) = inf makes it
    assert 0 < got[14] < np.finfo(np.float32).tiny  # subnormal, as the formula's
    silu = lg.logistic(x, mul=True)
    with np.errstate(invalid="ignore"):
        want_silu = x * want
    assert np.array_equal(np.isnan(silu), np.isnan(want_silu))  # -inf * 0 is NaN there too
    assert silu[2] == np.inf and silu[12] == 0 and np.signbit(silu[12])  # -100 * 0 = -0


@pytest.mark.usefixtures("compiled")
@pytest.mark.parametrize("shape", [(0,), (2, 0, 3), (), (1,), (7,), (3, 5, 17), (2, 3, 128, 130)])
def test_shapes(shape):
    x = np.asarray(np.random.default_rng(2).standard_normal(shape) * 8, np.float32)
    got = lg.logistic(x)
    assert got.shape == x.shape and got.dtype == np.float32 and isinstance(got, np.ndarray)
    assert np.abs(got - _exact(x)).max(initial=0) <= ABS_TOL
    # in place gives the same bits
    y = x.copy()
    assert lg.logistic(y, mul=True, out=y) is y
    assert y.tobytes() == lg.logistic(x, mul=True).tobytes()


@pytest.mark.usefixtures("compiled")
def test_non_contiguous_input_and_output():
    base = (np.random.default_rng(3).standard_normal((8, 6, 10)) * 5).astype(np.float32)
    for x in (base.transpose(2, 0, 1), base[:, ::2, 1::3], base[::-1]):
        want = lg.logistic(np.ascontiguousarray(x))
        assert lg.logistic(x).tobytes() == want.tobytes()
        out = np.empty(x.shape[::-1], np.float32).T  # a destination in the other order
        assert lg.logistic(x, out=out) is out and np.array_equal(out, want)
    y = base.copy()
    view = y[:, ::2]
    lg.logistic(view, mul=True, out=view)  # in place on a strided view
    assert np.array_equal(y[:, ::2], lg.logistic(base[:, ::2], mul=True))
    assert np.array_equal(y[:, 1::2], base[:, 1::2])


@needs_numba
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_run_thread_count_never_changes_the_bits(threads, monkeypatch):
    from onnxep.providers_cpu.ops import nn_cpu

    monkeypatch.setattr(nn_cpu, "run_threads", lambda: threads)
    x = (np.random.default_rng(4).standard_normal(3 * (1 << 16) + 5) * 6).astype(np.float32)
    whole = np.empty_like(x)
    jit.loop("logistic_span")(x, whole, np.float32(1), False, 0, x.size)
    assert lg.logistic(x).tobytes() == whole.tobytes()
    y = x.copy()
    lg.logistic(y, mul=True, out=y)
    assert y.tobytes() == (x * whole).tobytes()


def test_compiled_and_numpy_agree(monkeypatch):
    x = (np.random.default_rng(5).standard_normal(50_000) * 12).astype(np.float32)
    x[:4] = [np.nan, np.inf, -np.inf, -100]
    have_numba = jit.ENABLED
    monkeypatch.setattr(jit, "ENABLED", False)
    ref = lg.logistic(x)
    ref_silu = lg.logistic(x, 1.702, mul=True)
    assert ref.tobytes() == _formula32(x).tobytes()  # the NumPy path is the formula's bits
    if not have_numba:
        pytest.skip("numba not installed")
    monkeypatch.setattr(jit, "ENABLED", True)
    got = lg.logistic(x)
    np.testing.assert_allclose(got, ref, rtol=0, atol=ABS_TOL)
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(
            lg.logistic(x, 1.702, mul=True), ref_silu, rtol=2e-7, atol=ABS_TOL
        )


@pytest.mark.usefixtures("compiled")
def test_float64_keeps_numpy_exp():
    x = np.random.default_rng(6).standard_normal(1000) * 30
    with np.errstate(over="ignore"):
        want = 1 / (1 + np.exp(-x))
    assert lg.logistic(x).tobytes() == want.tobytes()
    assert lg.logistic(x, mul=True).tobytes() == (x * want).tobytes()


# -- the ops through sessions --------------------------------------------------------------


def _one_node(op, dtype, shape, domain="", opset=17, **attrs):
    node = H(op, ["x"], ["y"], domain=domain or None, **attrs)
    extra = [(domain, 1)] if domain else []
    return make_model(
        [node],
        [tensor("x", list(shape), ELEM[dtype])],
        [tensor("y", None, ELEM[dtype])],
        opset=opset,
        extra_opsets=extra,
    )


def _feed(shape, dtype, seed=7):
    x = (np.random.default_rng(seed).standard_normal(shape) * 6).astype(dtype)
    x.flat[:5] = [np.nan, np.inf, -np.inf, -100.0, 100.0][: x.size]
    return {"x": x}


def _close(got, want, x, tol, per_x=0.0):
    """|got - want| <= tol * (1 + |want|) + per_x * |x|, NaN where the other is NaN.

    ``per_x``: for x * sigmoid(.), onnxruntime's logistic is off by up to 1.7e-7 (MLAS's
    absolute error), which the product scales by |x|.
    """
    got, want, x = (np.asarray(a, np.float64) for a in (got, want, x))
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    with np.errstate(invalid="ignore"):
        err = np.where(got[ok] == want[ok], 0.0, np.abs(got[ok] - want[ok]))
    bound = tol * (1 + np.abs(want[ok]))
    if per_x:
        bound = bound + per_x * np.abs(x[ok])
    assert np.all(err <= bound), (x[ok][np.argmax(err - bound)], err.max())


def _compare(model, feed, tol, per_x=0.0):
    got = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"]).run(None, feed)[0]
    peer = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = peer.run(None, feed)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    _close(got, want, feed["x"], tol, per_x)
    return got


@pytest.mark.usefixtures("compiled")
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("shape", [(2, 3, 33, 17), (5,)])
def test_sigmoid_against_onnxruntime(dtype, shape):
    tol = {np.float16: 1e-3, np.float32: 3e-7, np.float64: 1e-12}[dtype]
    got = _compare(_one_node("Sigmoid", dtype, shape), _feed(shape, dtype), tol)
    if dtype == np.float32:
        assert got.tobytes() == lg.logistic(_feed(shape, dtype)["x"]).tobytes()


@pytest.mark.usefixtures("compiled")
@pytest.mark.parametrize("alpha", [None, 1.0, 0.5])
def test_quick_gelu_against_onnxruntime(alpha):
    attrs = {} if alpha is None else {"alpha": alpha}
    model = _one_node("QuickGelu", np.float32, (4, 7, 50), domain="com.microsoft", **attrs)
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    assert [n.provider for n in sess.placement().nodes] == ["cpu"]
    _compare(model, _feed((4, 7, 50), np.float32), 1e-6, per_x=2e-7)


@pytest.mark.usefixtures("compiled")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_quick_gelu_float64_and_half_go_their_ways(dtype):
    model = _one_node("QuickGelu", dtype, (3, 40), domain="com.microsoft", alpha=1.702)
    x = _feed((3, 40), dtype)["x"]
    got = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"]).run(None, {"x": x})[
        0
    ]
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(np.float64) / (1 + np.exp(-1.702 * x.astype(np.float64)))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=ABS_TOL, equal_nan=True)


@pytest.mark.usefixtures("compiled")
@pytest.mark.parametrize("alpha", [None, 1.0, 2.5])
def test_swish_opset_24(alpha):
    attrs = {} if alpha is None else {"alpha": alpha}
    model = _one_node("Swish", np.float32, (3, 64), opset=24, **attrs)
    model.ir_version = 11
    x = _feed((3, 64), np.float32)["x"]
    got = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"]).run(None, {"x": x})[
        0
    ]
    a = 1.0 if alpha is None else alpha
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(np.float64) / (1 + np.exp(-np.float32(a) * x.astype(np.float64)))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=ABS_TOL, equal_nan=True)
    try:
        peer = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # an onnxruntime without Swish-24
        return
    _close(got, peer.run(None, {"x": x})[0], x, 1e-6, per_x=2e-7 * np.float32(a))


@pytest.mark.usefixtures("compiled")
def test_silu_fusion_on_a_non_conv_producer():
    # Add -> Sigmoid -> Mul: fuse_silu makes onnxep::SiLU, the same bits as the two nodes
    nodes = [H("Add", ["x", "x"], ["a"]), H("Sigmoid", ["a"], ["s"]), H("Mul", ["a", "s"], ["y"])]
    model = make_model(nodes, [tensor("x", [2, 8, 40])], [tensor("y", None)]).SerializeToString()
    fused = onnxep.InferenceSession(model, providers=["cpu"])
    assert "SiLU" in [n.op_type for n in fused.placement().nodes]
    plain = onnxep.InferenceSession(
        model, onnxep.SessionOptions(disabled_rewrites=["fuse_silu"]), providers=["cpu"]
    )
    feed = _feed((2, 8, 40), np.float32)
    got, want = fused.run(None, feed)[0], plain.run(None, feed)[0]
    assert got.tobytes() == want.tobytes()
    peer = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    _close(got, peer, 2 * feed["x"], 1e-6, per_x=2e-7)


# FusedConv (com.microsoft, as onnxruntime's optimiser writes it) with Sigmoid, and Conv ->
# Sigmoid -> Mul (onnxep::FusedConv SiLU): dense, depthwise (flat loop), depthwise on a small
# map with 32 channels (channels-last loop)
CONVS = [(4, 6, 3, 1, 1, 9), (6, 6, 3, 6, 2, 11), (32, 32, 3, 32, 1, 7)]


def _conv_model(conv, act):
    cin, cout, ks, group, stride, hw = conv
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((cout, cin // group, ks, ks)) * 0.5).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    geo = dict(group=group, strides=[stride] * 2, pads=[ks // 2] * 4)
    if act == "Sigmoid":
        nodes = [
            H(
                "FusedConv",
                ["x", "w", "b"],
                ["y"],
                domain="com.microsoft",
                activation="Sigmoid",
                **geo,
            )
        ]
        extra = [("com.microsoft", 1)]
    else:
        nodes = [
            H("Conv", ["x", "w", "b"], ["c"], **geo),
            H("Sigmoid", ["c"], ["s"]),
            H("Mul", ["c", "s"], ["y"]),
        ]
        extra = []
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    m = make_model(
        nodes, [tensor("x", [2, cin, hw, hw])], [tensor("y", None)], inits, extra_opsets=extra
    )
    return m.SerializeToString()


def _unfused(conv, act):
    """The same convolution as a plain Conv then the activation's nodes, never fused."""
    cin, cout, ks, group, stride, hw = conv
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((cout, cin // group, ks, ks)) * 0.5).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    nodes = [
        H("Conv", ["x", "w", "b"], ["c"], group=group, strides=[stride] * 2, pads=[ks // 2] * 4)
    ]
    nodes += (
        [H("Sigmoid", ["c"], ["y"])]
        if act == "Sigmoid"
        else [H("Sigmoid", ["c"], ["s"]), H("Mul", ["c", "s"], ["y"])]
    )
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    m = make_model(nodes, [tensor("x", [2, cin, hw, hw])], [tensor("y", None)], inits)
    so = onnxep.SessionOptions(disabled_rewrites=["fuse_conv_activation", "fuse_silu"])
    return onnxep.InferenceSession(m.SerializeToString(), so, providers=["cpu"])


@pytest.mark.usefixtures("compiled")
@pytest.mark.parametrize("conv", CONVS, ids=["dense", "depthwise", "depthwise-cl"])
@pytest.mark.parametrize("act", ["Sigmoid", "SiLU"])
def test_conv_epilogue_equals_unfused_and_onnxruntime(conv, act):
    model = _conv_model(conv, act)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    assert [n.op_type for n in sess.placement().nodes] == ["FusedConv"]
    cin, hw = conv[0], conv[5]
    x = (np.random.default_rng(1).standard_normal((2, cin, hw, hw)) * 3).astype(np.float32)
    got = sess.run(None, {"x": x})[0]
    want = _unfused(conv, act).run(None, {"x": x})[0]
    assert got.tobytes() == want.tobytes()
    peer = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, peer, rtol=1e-5, atol=1e-5 * np.abs(peer).max())


def test_fused_conv_sigmoid_float64_keeps_the_numpy_epilogue(monkeypatch):
    from onnxep.providers_cpu.ops.conv_epilogue import Epilogue

    epi = Epilogue("SiLU", None)
    assert not epi.compiled(np.float64)
    if jit.ENABLED:
        assert epi.compiled(np.float32)
    y = np.random.default_rng(8).standard_normal((2, 3, 5, 5)) * 40
    want = y * (1 / (1 + np.exp(-y)))
    epi.apply(y)
    assert y.tobytes() == want.tobytes()


def test_sigmoid_direct_call_and_errors():
    # a 0-d Sigmoid stays an array; an integer input is refused as before
    model = _one_node("Sigmoid", np.float32, ())
    got = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"]).run(
        None, {"x": np.array(0.5, np.float32)}
    )[0]
    assert isinstance(got, np.ndarray) and got.shape == () and abs(got - 0.62245935) < 1e-7
    bad = _one_node("Sigmoid", np.float32, (3,))
    bad.graph.input[0].type.tensor_type.elem_type = TensorProto.INT32
    bad.graph.output[0].type.tensor_type.elem_type = TensorProto.INT32
    with pytest.raises(Exception, match="(?i)sigmoid"):
        onnxep.InferenceSession(bad.SerializeToString(), providers=["cpu"]).run(
            None, {"x": np.arange(3, dtype=np.int32)}
        )


@pytest.mark.parametrize(
    "make",
    [
        lambda r: r.standard_normal(4),
        lambda r: r.standard_normal((1, 4)),
        lambda r: r.standard_normal((3, 1000)) * 40,
        lambda r: np.array(-1.5),  # 0-d
        lambda r: np.zeros((2, 0)),
        lambda r: r.standard_normal((5, 6))[:, ::2],  # strided: logistic()'s copy
        lambda r: r.standard_normal((5, 6)).T,
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sigmoid_entry_has_logistic_bits(make, dtype):
    # the Sigmoid node's call (two arguments for numba, no alpha) and logistic() run one loop
    x = make(np.random.default_rng(0)).astype(dtype)
    if x.size:
        x.reshape(-1)[0] = np.nan
    got = lg.sigmoid(x)
    want = lg.logistic(x)
    assert got.shape == x.shape and got.dtype == x.dtype
    assert got.tobytes() == want.tobytes()


@needs_numba
def test_sigmoid_entry_takes_the_two_argument_loop(monkeypatch):
    calls = []
    real = lg._flat()  # noqa: SLF001
    monkeypatch.setattr(lg, "_flat", lambda: lambda a, o: calls.append(a.shape) or real(a, o))
    x = np.arange(-6, 6, dtype=np.float32).reshape(3, 4)
    np.testing.assert_allclose(lg.sigmoid(x), _exact(x), rtol=0, atol=ABS_TOL)
    assert calls == [(12,)]
    lg.sigmoid(x.T)  # strided: logistic()'s path
    lg.sigmoid(x.astype(np.float64))
    assert calls == [(12,)]


def test_tiny_sigmoid_chain_against_onnxruntime():
    n = 12
    nodes = [
        H("Sigmoid", ["x" if i == 0 else f"t{i}"], [f"t{i + 1}" if i < n - 1 else "y"])
        for i in range(n)
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()
    x = np.array([[-3.0, -0.0, 0.5, 20.0]], np.float32)
    sess = onnxep.InferenceSession(data, providers=["cpu"])
    for _ in range(2):
        got = sess.run(None, {"x": x})[0]
        want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
