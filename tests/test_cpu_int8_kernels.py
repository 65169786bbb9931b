"""The CPU provider's 8-bit kernels: float BLAS (providers_cpu/ops/int_gemm.py) and the
tiles (providers_cpu/jit_int8.py, ops/vnni_gemm.py) on AVX-512 VNNI and on AVX2
(jit_int8_avx2.py).

MatMulInteger and ConvInteger must give the integer kernels' int32 results bit for bit:
checked against the integer definition (int64 products, cut to int32 as an int32
accumulator wraps) on large K and on the extreme values of each type, where the float32
path would round (the kernels must take float64 there), and against onnxruntime, on both
paths (``int_path``: the VNNI tiles where this CPU has VNNI, the AVX2 tiles where it has
AVX2, and BLAS with numba off).
DynamicQuantizeLSTM's batched hidden-state round trip must equal the one-direction one.
"""

from __future__ import annotations

import numpy as np
import pytest
from contrib_cases import elem, run_both
from onnx import helper, numpy_helper

import onnxep
from onnxep.errors import OnnxepError
from onnxep.providers.ops.quant import conv_nd
from onnxep.providers_cpu import jit, jit_int8
from onnxep.providers_cpu.ops import int_gemm, vnni_gemm
from onnxep.providers_cpu.ops.op_dynamic_quantize_lstm import (
    _fake_quant,
    _fake_quant_numpy,
    _fake_quant_per_direction,
)

U8, I8 = np.dtype(np.uint8), np.dtype(np.int8)


def _use_tiles(isa, monkeypatch):
    if not jit_int8.runnable(isa):
        pytest.skip(f"no numba or no {isa} here: its tiles do not run")
    monkeypatch.setattr(jit_int8, "_isa", isa)


@pytest.fixture(params=["vnni", "avx2", "blas"])
def int_path(request, monkeypatch):
    """Runs a test on the VNNI tiles and the AVX2 ones (each skipped where it cannot run)
    and on float BLAS (numba off)."""
    if request.param == "blas":
        monkeypatch.setattr(jit, "ENABLED", False)
    else:
        _use_tiles(request.param, monkeypatch)
    return request.param


@pytest.fixture(params=["vnni", "avx2"])
def tile_isa(request, monkeypatch):
    """The tiles on each instruction set this CPU runs (AVX-512 VNNI, AVX2)."""
    _use_tiles(request.param, monkeypatch)
    return request.param


def _model(op, inputs, consts, attrs=None, opset=13):
    node = helper.make_node(op, [n for n, _ in inputs], ["y"])
    node.attribute.extend(helper.make_attribute(k, v) for k, v in (attrs or {}).items())
    g_in = [
        helper.make_tensor_value_info(n, elem(a.dtype), a.shape)
        for n, a in inputs
        if n and n not in consts
    ]
    inits = [numpy_helper.from_array(np.asarray(a), n) for n, a in inputs if n and n in consts]
    out = [helper.make_tensor_value_info("y", elem(np.int32), None)]
    graph = helper.make_graph([node], "g", g_in, out, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _ours(op, inputs, consts, attrs=None):
    model = _model(op, inputs, consts, attrs)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    return sess.run(None, {n: a for n, a in inputs if n and n not in consts})[0]


def _extreme(rng, shape, dt):
    """Values of ``dt`` that are mostly its two ends, some anywhere between."""
    lo, hi = int_gemm.int_range(dt)
    v = rng.choice(np.array([lo, hi], np.int64), size=shape)
    some = rng.random(shape) < 0.3
    v[some] = rng.integers(lo, hi + 1, size=int(some.sum()))
    return v.astype(dt)


def _wrap32(v: np.ndarray) -> np.ndarray:
    return v.astype(np.int64).astype(np.int32)


def _matmul_ref(a, za, b, zb):
    ai = a.astype(np.int64) - (0 if za is None else np.asarray(za, np.int64).reshape(-1, 1))
    bi = b.astype(np.int64) - (0 if zb is None else np.asarray(zb, np.int64))
    return _wrap32(np.matmul(ai, bi))


@pytest.mark.parametrize("a_dt", [U8, I8])
@pytest.mark.parametrize("b_dt", [U8, I8])
@pytest.mark.parametrize("k", [1, 37, 1024, 5000])
@pytest.mark.parametrize("const_b", [True, False])
@pytest.mark.parametrize("zps", ["none", "scalar", "per_row_col"])
def test_matmul_integer_is_the_integer_product(a_dt, b_dt, k, const_b, zps, int_path):
    rng = np.random.default_rng(k)
    m, n = 6, 11
    a = _extreme(rng, (2, m, k), a_dt)
    b = _extreme(rng, (k, n), b_dt)
    za = zb = None
    if zps == "scalar":
        za, zb = np.array(_extreme(rng, (), a_dt)), np.array(_extreme(rng, (), b_dt))
    elif zps == "per_row_col":
        za, zb = _extreme(rng, (m,), a_dt), _extreme(rng, (n,), b_dt)
    inputs = [("a", a), ("b", b)]
    if za is not None:
        inputs += [("za", za), ("zb", zb)]
    consts = {"b", "zb"} if const_b else set()
    got = _ours("MatMulInteger", inputs, consts)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, _matmul_ref(a, za, b, zb))


@pytest.mark.parametrize("k", [258, 259])
def test_matmul_integer_at_float32s_limit(k):
    """258 products of 255 * 255 sum to 16776450 <= 2^24 (float32 exact); 259 to 16841475,
    which float32 rounds to 16841476: the kernel must see that and take float64."""
    a = np.full((1, k), 255, np.uint8)
    b = np.full((k, 1), 255, np.uint8)
    assert int_gemm.compute_dtype(k * 255 * 255) == (np.float32 if k == 258 else np.float64)
    if k == 259:
        assert int(np.float32(k * 255 * 255)) != k * 255 * 255
    got = _ours("MatMulInteger", [("a", a), ("b", b)], {"b"})
    assert got.tolist() == [[k * 255 * 255]]


def test_matmul_integer_wraps_as_int32(int_path):
    """Past 2^31 the int32 accumulator wraps; the float64 path wraps the same way."""
    k = 40000
    a = np.full((2, k), 255, np.uint8)
    b = np.full((k, 3), 255, np.uint8)
    b[::7, 1] = 0
    got = _ours("MatMulInteger", [("a", a), ("b", b)], {"b"})
    np.testing.assert_array_equal(got, _matmul_ref(a, None, b, None))
    assert got[0, 0] == np.int64(k * 255 * 255 - (1 << 32))


def test_matmul_integer_batched_b(int_path):
    rng = np.random.default_rng(2)
    a = _extreme(rng, (3, 4, 300), U8)
    b = _extreme(rng, (3, 300, 5), I8)
    zb = np.array(-3, np.int8)
    got = _ours("MatMulInteger", [("a", a), ("b", b), ("", None), ("zb", zb)], {"b", "zb"})
    np.testing.assert_array_equal(got, _matmul_ref(a, None, b, zb))


def test_matmul_integer_bad_zero_point(int_path):
    a = np.zeros((4, 3), np.uint8)
    b = np.zeros((3, 5), np.uint8)
    inputs = [("a", a), ("b", b), ("za", np.zeros(2, np.uint8)), ("zb", np.zeros(1, np.uint8))]
    with pytest.raises(OnnxepError, match="a_zero_point must have 1 element or one per row"):
        _ours("MatMulInteger", inputs, {"b"})


@pytest.mark.parametrize("a_dt,b_dt", [(U8, U8), (U8, I8), (I8, I8)])
def test_matmul_integer_against_onnxruntime(a_dt, b_dt, int_path):
    rng = np.random.default_rng(3)
    a = _extreme(rng, (5, 700), a_dt)
    b = _extreme(rng, (700, 9), b_dt)
    za, zb = np.array(_extreme(rng, (), a_dt)), np.array(_extreme(rng, (), b_dt))
    inputs = [("a", a), ("b", b), ("za", za), ("zb", zb)]
    model = _model("MatMulInteger", inputs, {"b", "zb"})
    (got,), (ref,) = run_both(model, {"a": a, "za": za})
    np.testing.assert_array_equal(got, ref)


def _conv_ref(x, zx, w, zw, attrs):
    xi = x.astype(np.int64) - int(zx)
    wi = w.astype(np.int64)
    if zw is not None:
        zw = np.asarray(zw, np.int64)
        wi = wi - (zw.reshape(-1, 1, 1, 1) if zw.size > 1 else zw.reshape(()))
    p = {
        "strides": attrs.get("strides", [1, 1]),
        "dilations": attrs.get("dilations", [1, 1]),
        "pads": attrs.get("pads", [0, 0, 0, 0]),
        "auto_pad": "NOTSET",
        "group": attrs.get("group", 1),
    }
    return _wrap32(conv_nd(xi, wi, p, np))


CONVS = {
    "3x3": (4, 6, 3, {"pads": [1, 1, 1, 1]}),
    "3x3-stride2": (4, 6, 3, {"pads": [1, 0, 1, 2], "strides": [2, 2]}),
    "1x1": (8, 5, 1, {}),
    "dilated": (3, 4, 3, {"dilations": [2, 2], "pads": [2, 2, 2, 2]}),
    "grouped": (6, 4, 3, {"group": 2, "pads": [1, 1, 1, 1]}),
    "depthwise": (6, 6, 3, {"group": 6, "pads": [1, 1, 1, 1]}),
    "wide": (64, 8, 3, {"pads": [1, 1, 1, 1]}),  # 576 taps of extremes: float64
}


@pytest.mark.parametrize("case", sorted(CONVS))
@pytest.mark.parametrize("x_dt,w_dt", [(U8, U8), (U8, I8), (I8, I8)])
@pytest.mark.parametrize("zps", ["none", "scalar", "per_channel"])
@pytest.mark.parametrize("const_w", [True, False])
def test_conv_integer_is_the_integer_convolution(case, x_dt, w_dt, zps, const_w, int_path):
    c, m, kk, attrs = CONVS[case]
    rng = np.random.default_rng(c * 10 + m)
    x = _extreme(rng, (2, c, 9, 8), x_dt)
    w = _extreme(rng, (m, c // attrs.get("group", 1), kk, kk), w_dt)
    zx, zw = np.array(0, x_dt), None
    inputs = [("x", x), ("w", w)]
    if zps != "none":
        zx = np.array(_extreme(rng, (), x_dt))
        zw = np.array(_extreme(rng, (), w_dt)) if zps == "scalar" else _extreme(rng, (m,), w_dt)
        inputs += [("zx", zx), ("zw", zw)]
    consts = {"w", "zw"} if const_w else set()
    got = _ours("ConvInteger", inputs, consts, attrs)
    np.testing.assert_array_equal(got, _conv_ref(x, zx, w, zw, attrs))


def test_conv_integer_takes_float64_past_float32s_limit():
    """64 channels of 3x3 taps at the ends of uint8: 576 * 255 * 255 = 37454400 > 2^24."""
    w = np.full((1, 64, 3, 3), 255, np.uint8)
    assert int_gemm.row_l1(w.astype(np.int64)) * 255 > int_gemm.F32_EXACT
    x = np.full((1, 64, 3, 3), 255, np.uint8)
    x[0, ::3, 1, 2] = 0
    got = _ours("ConvInteger", [("x", x), ("w", w)], {"w"})
    np.testing.assert_array_equal(got, _conv_ref(x, 0, w, None, {}))


def test_conv_integer_bad_zero_point(int_path):
    x = np.zeros((1, 2, 4, 4), np.uint8)
    w = np.zeros((3, 2, 1, 1), np.uint8)
    inputs = [("x", x), ("w", w), ("zx", np.zeros(1, np.uint8)), ("zw", np.zeros(2, np.uint8))]
    with pytest.raises(OnnxepError, match="w_zero_point must have 1 element or one per"):
        _ours("ConvInteger", inputs, {"w", "zw"})


@pytest.mark.parametrize("case", ["3x3", "3x3-stride2", "1x1", "grouped", "wide"])
def test_conv_integer_against_onnxruntime(case, int_path):
    c, m, kk, attrs = CONVS[case]
    rng = np.random.default_rng(7)
    x = _extreme(rng, (1, c, 10, 9), U8)
    w = _extreme(rng, (m, c // attrs.get("group", 1), kk, kk), U8)
    zx, zw = np.array(131, np.uint8), np.array(7, np.uint8)
    inputs = [("x", x), ("w", w), ("zx", zx), ("zw", zw)]
    model = _model("ConvInteger", inputs, {"w", "zw"}, attrs)
    (got,), (ref,) = run_both(model, {"x": x, "zx": zx})
    np.testing.assert_array_equal(got, ref)


def test_lstm_hidden_round_trip_per_direction_is_the_one_direction_one():
    rng = np.random.default_rng(9)
    h = (rng.standard_normal((4, 3, 16)) * [[[0.1]], [[3.0]], [[1.0]], [[1.0]]]).astype(np.float32)
    h[2] = 0  # an all-zero state: scale 1
    h[3] = -np.abs(h[3])  # all negative: zero point 255
    h[1, 0, :3] = 1e30  # one outlier takes the whole range
    want = np.stack([_fake_quant(h[d]) for d in range(h.shape[0])])
    # the compiled loop (with numba) and the NumPy calls
    for got in (_fake_quant_per_direction(h), _fake_quant_numpy(h)):
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def _qlinear_model(op, inputs, consts, out_dt, attrs=None):
    model = _model(op, inputs, consts, attrs)
    model.graph.output[0].type.tensor_type.elem_type = elem(out_dt)
    return model


@pytest.mark.parametrize("dt", [U8, I8])
@pytest.mark.parametrize("per_column", [False, True])
def test_q_linear_mat_mul_against_onnxruntime(dt, per_column):
    rng = np.random.default_rng(11)
    k, n = 600, 7
    a = _extreme(rng, (3, k), dt)
    b = _extreme(rng, (k, n), dt)
    zb = _extreme(rng, (n,), dt) if per_column else np.array(_extreme(rng, (), dt))
    sb = rng.uniform(1e-3, 2e-3, n if per_column else ()).astype(np.float32)
    inputs = [
        ("a", a), ("sa", np.array(0.02, np.float32)), ("za", np.array(_extreme(rng, (), dt))),
        ("b", b), ("sb", sb), ("zb", zb),
        ("sy", np.array(40.0, np.float32)), ("zy", np.array(3, dt)),
    ]  # fmt: skip
    consts = {"b", "sb", "zb", "sy", "zy"}
    model = _qlinear_model("QLinearMatMul", inputs, consts, dt)
    feeds = {n_: v for n_, v in inputs if n_ not in consts}
    (got,), (ref,) = run_both(model, feeds)
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("w_dt", [U8, I8])
@pytest.mark.parametrize("per_channel", [False, True])
def test_q_linear_conv_against_onnxruntime(w_dt, per_channel):
    rng = np.random.default_rng(12)
    c, m = 32, 6
    x = _extreme(rng, (1, c, 7, 8), U8)
    w = _extreme(rng, (m, c, 3, 3), w_dt)
    if w_dt == I8:  # onnxruntime takes int8 weights with zero point 0 only
        zw = np.zeros(m if per_channel else (), np.int8)
    else:
        zw = _extreme(rng, (m,), w_dt) if per_channel else np.array(9, w_dt)
    sw = rng.uniform(1e-3, 2e-3, m if per_channel else ()).astype(np.float32)
    inputs = [
        ("x", x), ("sx", np.array(0.05, np.float32)), ("zx", np.array(120, np.uint8)),
        ("w", w), ("sw", sw), ("zw", zw),
        ("sy", np.array(30.0, np.float32)), ("zy", np.array(128, np.uint8)),
        ("bias", rng.integers(-5000, 5000, m).astype(np.int32)),
    ]  # fmt: skip
    consts = {"w", "sw", "zw", "sy", "zy", "bias"}
    model = _qlinear_model("QLinearConv", inputs, consts, U8, {"pads": [1, 1, 1, 1]})
    feeds = {n_: v for n_, v in inputs if n_ not in consts}
    (got,), (ref,) = run_both(model, feeds)
    np.testing.assert_array_equal(got, ref)


def test_dynamic_quantize_linear_is_the_generic_kernel():
    from onnxep.providers.ops.op_dynamic_quantize_linear import dynamic_quantize_linear as generic
    from onnxep.providers_cpu.ops.op_dynamic_quantize_linear import dynamic_quantize_linear

    rng = np.random.default_rng(13)
    cases = [
        rng.standard_normal((1, 24, 32, 48)).astype(np.float32),
        np.zeros((3, 4), np.float32),  # zero range: scale 0, everything 0
        -np.abs(rng.standard_normal(100)).astype(np.float32),  # zero point 255
        np.abs(rng.standard_normal(100)).astype(np.float32) * 1e-30,
        np.zeros(0, np.float32),
        (rng.standard_normal(1000) * 1e4).astype(np.float32),
        np.array([0.5, 1.5, 2.5, -0.5, 255.0], np.float32),  # halves round to even
    ]
    ours, theirs = dynamic_quantize_linear(None, np), generic(None, np)
    for x in cases:
        for g, w in zip(ours(x), theirs(x)):
            assert type(g) is type(w) and g.dtype == w.dtype and g.shape == w.shape
            assert g.tobytes() == w.tobytes(), (x[:5], g, w)


@pytest.mark.parametrize("spatial", [(11,), (5, 6, 4)])
def test_conv_integer_1d_and_3d(spatial, int_path):
    rng = np.random.default_rng(len(spatial))
    nsp = len(spatial)
    x = _extreme(rng, (2, 4, *spatial), U8)
    w = _extreme(rng, (3, 4, *([3] * nsp)), I8)
    zx, zw = np.array(17, np.uint8), np.array(-2, np.int8)
    attrs = {"pads": [1] * (2 * nsp), "strides": [2] + [1] * (nsp - 1)}
    got = _ours("ConvInteger", [("x", x), ("w", w), ("zx", zx), ("zw", zw)], {"w", "zw"}, attrs)
    xi = x.astype(np.int64) - 17
    wi = w.astype(np.int64) + 2
    p = {"strides": attrs["strides"], "dilations": [1] * nsp, "pads": attrs["pads"]}
    want = _wrap32(conv_nd(xi, wi, p | {"auto_pad": "NOTSET", "group": 1}, np))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_conv_integer_auto_pad(auto_pad, int_path):
    rng = np.random.default_rng(5)
    x = _extreme(rng, (1, 3, 7, 6), U8)
    w = _extreme(rng, (2, 3, 3, 2), U8)
    attrs = {"auto_pad": auto_pad, "strides": [2, 1]}
    got = _ours("ConvInteger", [("x", x), ("w", w)], {"w"}, attrs)
    p = {"strides": [2, 1], "dilations": [1, 1], "pads": None, "auto_pad": auto_pad, "group": 1}
    np.testing.assert_array_equal(
        got, _wrap32(conv_nd(x.astype(np.int64), w.astype(np.int64), p, np))
    )


# -- DynamicQuantizeLSTM's compiled loop (providers_cpu/ops/recurrent_loops.py) ----------


def test_compiled_hidden_quantisation_is_the_numpy_round_trip():
    """recurrent_loops.quantize_rows: the same integers and scale as the NumPy round trip
    (its integers times its scale are _fake_quant's output, bit for bit)."""
    from onnxep.providers_cpu import jit

    if not jit.ENABLED:
        pytest.skip("numba not installed: no compiled recurrence")
    from onnxep.providers_cpu.ops import recurrent_jit

    loops = recurrent_jit.loops()
    rng = np.random.default_rng(11)
    cases = [rng.standard_normal((3, 17)).astype(np.float32) * s for s in (1e-3, 0.5, 40.0)]
    cases += [np.zeros((2, 5), np.float32), -np.abs(cases[1]), np.abs(cases[1])]
    cases += [np.full((1, 3), 0.25, np.float32), np.array([[1e-38, 3e-39, 0.0]], np.float32)]
    for h in cases:
        rows = np.arange(h.shape[0], dtype=np.int64)
        hq = np.empty_like(h)
        scale = loops.quantize_rows(h, rows, h.shape[0], hq)
        want = _fake_quant(h)
        got = hq * np.float32(scale)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        assert np.array_equal(hq, np.rint(hq)) and np.abs(hq).max() <= 255
    h = np.array([[0.5, np.nan]], np.float32)  # not finite: the loop gives up
    assert loops.quantize_rows(h, np.arange(1), 1, np.empty_like(h)) < 0


def _dq_lstm(
    rng, direction, T, batch, n_in, H, w_dt, per_channel, peep, clip, constant, states=True,
    symmetric=False,
):  # fmt: skip
    D = 2 if direction == "bidirectional" else 1
    lo, hi = (-128 + symmetric, 128) if w_dt == I8 else (0, 256)
    W = rng.integers(lo, hi, (D, n_in, 4 * H)).astype(w_dt)
    R = rng.integers(lo, hi, (D, H, 4 * H)).astype(w_dt)
    shape = (D, 4 * H) if per_channel else (D,)
    ws = rng.uniform(0.002, 0.02, shape).astype(np.float32)
    rs = rng.uniform(0.002, 0.02, shape).astype(np.float32)
    if w_dt == I8:
        wz, rz = np.zeros(shape, I8), np.zeros(shape, I8)
    else:  # uint8 weights less their zero point need int16
        wz, rz = rng.integers(100, 156, shape).astype(U8), rng.integers(0, 256, shape).astype(U8)
    feeds = {
        "X": rng.standard_normal((T, batch, n_in)).astype(np.float32),
        "W": W, "R": R,
        "B": (rng.standard_normal((D, 8 * H)) * 0.3).astype(np.float32),
        "h0": (rng.standard_normal((D, batch, H)) * 0.5).astype(np.float32),
        "c0": (rng.standard_normal((D, batch, H)) * 0.5).astype(np.float32),
    }  # fmt: skip
    if peep:
        feeds["P"] = (rng.standard_normal((D, 3 * H)) * 0.3).astype(np.float32)
    feeds |= {"ws": ws, "wz": wz, "rs": rs, "rz": rz}
    if not states:
        del feeds["h0"], feeds["c0"]
    init = ["h0", "c0"] if states else ["", ""]
    slots = ["X", "W", "R", "B", "", *init, "P" if peep else "", "ws", "wz", "rs", "rz"]
    attrs = dict(hidden_size=H, direction=direction)
    if clip:
        attrs["clip"] = clip
    node = helper.make_node(
        "DynamicQuantizeLSTM", slots, ["Y", "Y_h", "Y_c"], domain="com.microsoft", **attrs
    )
    fixed = {"W", "R", "B", "ws", "wz", "rs", "rz", "P"} if constant else set()
    g_in = [
        helper.make_tensor_value_info(n, elem(feeds[n].dtype), feeds[n].shape)
        for n in slots
        if n and n not in fixed
    ]
    inits = [numpy_helper.from_array(feeds[n], n) for n in slots if n and n in fixed]
    outs = [helper.make_tensor_value_info(n, elem(np.float32), None) for n in ("Y", "Y_h", "Y_c")]
    model = helper.make_model(
        helper.make_graph([node], "g", g_in, outs, inits),
        opset_imports=[helper.make_opsetid("", 14), helper.make_opsetid("com.microsoft", 1)],
    )
    return model, {k: v for k, v in feeds.items() if k not in fixed}


@pytest.mark.parametrize(
    ("direction", "T", "batch", "n_in", "H", "w_dt", "per_channel", "peep", "clip"),
    [
        ("bidirectional", 9, 2, 16, 17, I8, False, False, None),
        ("bidirectional", 5, 1, 3, 1, I8, True, True, 0.8),
        ("forward", 6, 3, 5, 3, U8, False, False, None),
        ("reverse", 4, 4, 7, 17, U8, False, True, 1.5),
        ("bidirectional", 40, 3, 9, 5, I8, True, False, None),  # 120 rows: BLAS projection
    ],
)
@pytest.mark.parametrize("constant", [True, False])
def test_dynamic_quantize_lstm_compiled_and_numpy(
    direction, T, batch, n_in, H, w_dt, per_channel, peep, clip, constant, monkeypatch
):
    """The compiled loop (8-bit weights in the loop, int16 for uint8 weights less their zero
    point, the BLAS projection past 64 rows) against onnxruntime on one thread (constant
    weights: it refuses fed ones, and per-column zero points of uint8 weights) and against
    the NumPy path. The hidden state's quantisation is exact on both sides, so a last-bit
    difference in h can move one value by one step of its scale (a step is about 1/255 of
    the state's range, times a weight): hence 1e-4 rather than float rounding."""
    from onnxep.providers_cpu import jit

    if not jit.ENABLED:
        pytest.skip("numba not installed: no compiled recurrence")
    rng = np.random.default_rng(H * 7 + T)
    model, feeds = _dq_lstm(rng, direction, T, batch, n_in, H, w_dt, per_channel, peep, clip,
                            constant)  # fmt: skip
    got, ref = run_both(model, feeds, ort_threads=1) if constant else (None, None)
    got = onnxep.InferenceSession(model, providers=["cpu"]).run(None, feeds)
    monkeypatch.setattr(jit, "ENABLED", False)
    numpy_path = onnxep.InferenceSession(model, providers=["cpu"]).run(None, feeds)
    for k, (g, n) in enumerate(zip(got, numpy_path)):
        np.testing.assert_allclose(g, n, atol=1e-4, rtol=1e-4)
        if ref is not None:  # onnxruntime takes constant weights only
            np.testing.assert_allclose(g, ref[k], atol=1e-4, rtol=1e-4)


# -- DynamicQuantizeLSTM on the tiles (providers_cpu/ops/recurrent_vnni.py) ----------------

needs_tiles = pytest.mark.usefixtures("tile_isa")


@pytest.fixture
def vnni_calls(tile_isa, monkeypatch):
    """(directions, result) of each call of the tiles' LSTM loop (one call per run on one
    thread; result 1 done, 0 gave up at a hidden state, -1 X not finite)."""
    from onnxep.providers_cpu.ops import recurrent_vnni

    calls = []
    # on AVX2, weights with no -128 take the sign-pair tiles' loops (jit_int8.weights_isa)
    for isa in ("avx2", "avx2s") if tile_isa == "avx2" else (tile_isa,):
        loops = recurrent_vnni.loops(isa)

        def spy(*args, real=loops.lstm_node):
            result = real(*args)
            calls.append((list(range(args[-2], args[-1])), result))
            return result

        monkeypatch.setattr(loops, "lstm_node", spy)
    return calls


def _runs(model, feeds, monkeypatch):
    """The node's outputs on the tiles, on the float compiled loop (tiles off) and on the
    NumPy path (numba off)."""
    tiles = onnxep.InferenceSession(model, providers=["cpu"]).run(None, feeds)
    with monkeypatch.context() as m:
        m.setattr(jit_int8, "_isa", "")
        loop = onnxep.InferenceSession(model, providers=["cpu"]).run(None, feeds)
    with monkeypatch.context() as m:
        m.setattr(jit, "ENABLED", False)
        numpy_path = onnxep.InferenceSession(model, providers=["cpu"]).run(None, feeds)
    return tiles, loop, numpy_path


@needs_tiles
@pytest.mark.parametrize(
    ("direction", "T", "batch", "n_in", "H", "w_dt", "per_channel", "peep", "clip", "states"),
    [
        ("bidirectional", 9, 2, 128, 64, I8, False, False, None, True),  # tashkeel's shape
        ("bidirectional", 9, 2, 16, 17, I8, False, False, None, False),
        ("bidirectional", 1, 2, 16, 17, I8, False, False, None, True),  # one step
        ("bidirectional", 1, 1, 3, 1, U8, True, False, None, False),
        ("forward", 2, 1, 5, 16, I8, True, True, None, True),
        ("forward", 7, 3, 5, 3, U8, False, False, None, False),
        ("forward", 4, 4, 9, 20, I8, False, True, 1.5, True),  # 4 rows: the 4-row tile
        ("forward", 5, 5, 9, 20, U8, True, False, None, True),  # 4 + 1 rows
        ("reverse", 6, 3, 7, 17, U8, False, True, 1.5, True),  # 3 rows
        ("reverse", 3, 1, 64, 32, I8, True, False, 0.5, False),
        ("reverse", 1, 6, 4, 8, I8, False, False, None, True),  # 4 + 2 rows
        ("bidirectional", 40, 3, 9, 5, I8, True, False, None, True),  # 120 rows
    ],
)
@pytest.mark.parametrize("constant", [True, False])
def test_dynamic_quantize_lstm_on_the_tiles(
    direction, T, batch, n_in, H, w_dt, per_channel, peep, clip, states, constant,
    vnni_calls, monkeypatch,
):  # fmt: skip
    """The tiles' loop (input projection and every step's product in exact int32) against
    the float compiled loop, whose float32 sums of the same integers are exact at these
    sizes, so the two agree bit for bit when both project in the loop (up to 64 rows), and
    against the NumPy path and onnxruntime (constant weights) within the hidden state's
    quantisation step (see test_dynamic_quantize_lstm_compiled_and_numpy)."""
    rng = np.random.default_rng(T * 100 + batch * 10 + H)
    model, feeds = _dq_lstm(rng, direction, T, batch, n_in, H, w_dt, per_channel, peep, clip,
                            constant, states)  # fmt: skip
    tiles, loop, numpy_path = _runs(model, feeds, monkeypatch)
    assert [d for dirs, done in vnni_calls for d in dirs if done == 1] == (
        [0, 1] if direction == "bidirectional" else [0]
    )
    for g, f, n in zip(tiles, loop, numpy_path):
        assert g.dtype == np.float32 and g.shape == n.shape
        if T * batch <= 64:
            np.testing.assert_array_equal(g, f)
        np.testing.assert_allclose(g, f, atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(g, n, atol=1e-4, rtol=1e-4)
    if constant and not (w_dt == U8 and per_channel):  # what onnxruntime takes
        _, ref = run_both(model, feeds, ort_threads=1)
        for g, r in zip(tiles, ref):
            np.testing.assert_allclose(g, r, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("batch", "n_in", "H"), [(1, 128, 64), (3, 20, 8), (1, 4, 4)])
def test_dynamic_quantize_lstm_on_avx2_sign_pairs(batch, n_in, H, monkeypatch):
    """Symmetric int8 weights (no -128, what quantize_dynamic writes) with K a multiple of 4
    take AVX2's sign-pair tiles for single rows (jit_int8.weights_isa): the float loop's
    bits (exact sums of the same integers), the NumPy path and onnxruntime within the
    hidden state's quantisation step."""
    _use_tiles("avx2", monkeypatch)
    from onnxep.providers_cpu.ops import recurrent_vnni

    loops = recurrent_vnni.loops("avx2s")
    calls = []
    real = loops.lstm_node
    monkeypatch.setattr(loops, "lstm_node", lambda *a: calls.append(1) or real(*a))
    rng = np.random.default_rng(batch * 100 + H)
    model, feeds = _dq_lstm(rng, "bidirectional", 5, batch, n_in, H, I8, True, True, None,
                            True, symmetric=True)  # fmt: skip
    tiles, loop, numpy_path = _runs(model, feeds, monkeypatch)
    assert calls == [1]
    for g, f, n in zip(tiles, loop, numpy_path):
        np.testing.assert_array_equal(g, f)
        np.testing.assert_allclose(g, n, atol=1e-4, rtol=1e-4)
    _, ref = run_both(model, feeds, ort_threads=1)
    for g, r in zip(tiles, ref):
        np.testing.assert_allclose(g, r, atol=1e-4, rtol=1e-4)


@needs_tiles
def test_dynamic_quantize_lstm_tiles_without_bias(vnni_calls, monkeypatch):
    """No B (input 3 empty): the projection's epilogue adds -0.0; onnxruntime's results, and
    the float loop's bits."""
    rng = np.random.default_rng(4)
    model, feeds = _dq_lstm(rng, "bidirectional", 5, 2, 12, 20, I8, True, False, None, True)
    model.graph.node[0].input[3] = ""
    keep = [i for i in model.graph.initializer if i.name != "B"]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)
    tiles, loop, _ = _runs(model, feeds, monkeypatch)
    assert [done for _, done in vnni_calls] == [1]
    _, ref = run_both(model, feeds, ort_threads=1)
    for g, f, r in zip(tiles, loop, ref):
        np.testing.assert_array_equal(g, f)
        np.testing.assert_allclose(g, r, atol=1e-4, rtol=1e-4)


@needs_tiles
def test_dynamic_quantize_lstm_tiles_directions_on_two_threads(vnni_calls, monkeypatch):
    """Past PARALLEL_WORK each direction is its own call, on the run's threads (each
    quantizes X itself): the same bits as both in one call."""
    from onnxep.providers_cpu.ops import op_dynamic_quantize_lstm

    rng = np.random.default_rng(8)
    model, feeds = _dq_lstm(rng, "bidirectional", 9, 3, 64, 66, I8, True, True, None, True)
    so = onnxep.SessionOptions()
    so.intra_op_num_threads = 2
    one_call = onnxep.InferenceSession(model, so, providers=["cpu"]).run(None, feeds)
    assert [dirs for dirs, _ in vnni_calls] == [[0, 1]]
    monkeypatch.setattr(op_dynamic_quantize_lstm, "PARALLEL_WORK", 0)
    # and parallel_rows' own floor, under which it runs both on the calling thread
    monkeypatch.setattr("onnxep.providers_cpu.ops.nn_cpu._PARALLEL_MIN", 0)
    split = onnxep.InferenceSession(model, so, providers=["cpu"]).run(None, feeds)
    assert sorted(dirs for dirs, _ in vnni_calls[1:]) == [[0], [1]]
    for a, b in zip(one_call, split):
        assert a.tobytes() == b.tobytes()


@needs_tiles
def test_dynamic_quantize_lstm_tiles_leave_what_is_not_finite(vnni_calls, monkeypatch):
    """An X with a NaN never reaches the tiles (the other paths' answer, here their error,
    is unchanged); a hidden state that is not finite (a NaN in initial_h) makes the loop
    give up, and the NumPy path answers."""
    rng = np.random.default_rng(5)
    model, feeds = _dq_lstm(rng, "bidirectional", 4, 2, 6, 5, I8, False, False, None, True)
    feeds["X"][1, 0, 2] = np.nan
    errors = []
    for isa in (jit_int8.tiles(), ""):
        with monkeypatch.context() as m, pytest.raises(OnnxepError) as err:
            m.setattr(jit_int8, "_isa", isa)
            onnxep.InferenceSession(model, providers=["cpu"]).run(None, feeds)
        errors.append(str(err.value))
    assert errors[0] == errors[1] and [done for _, done in vnni_calls] == [-1]
    model, feeds = _dq_lstm(rng, "forward", 3, 2, 6, 5, I8, False, True, None, True)
    feeds["h0"][0, 1, 3] = np.nan
    tiles, _, numpy_path = _runs(model, feeds, monkeypatch)
    assert [done for _, done in vnni_calls[1:]] == [0]
    for g, n in zip(tiles, numpy_path):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(n))
        np.testing.assert_allclose(g, n, atol=1e-4, rtol=1e-4)


@needs_tiles
@pytest.mark.parametrize(
    ("name", "bad", "error"),
    [
        ("P", lambda p: p[:, :4], "P has shape"),
        ("B", lambda b: b[:, :7], "B has shape"),
        ("X", lambda x: x[:, :, :5], "X has shape"),
        ("X", lambda x: x[0], "X has shape"),
    ],
)
def test_dynamic_quantize_lstm_tiles_check_shapes(name, bad, error, monkeypatch):
    """Bad shapes (inputs declared without one) get the same clear errors on the tiles' path
    as on the float loop's."""
    rng = np.random.default_rng(6)
    model, feeds = _dq_lstm(rng, "forward", 3, 2, 6, 5, I8, False, True, None, False, False)
    for vi in model.graph.input:
        vi.type.tensor_type.ClearField("shape")
    feeds = feeds | {name: bad(feeds[name])}
    errors = []
    for isa in (jit_int8.tiles(), ""):
        with monkeypatch.context() as m, pytest.raises(OnnxepError, match=error) as err:
            m.setattr(jit_int8, "_isa", isa)
            onnxep.InferenceSession(model, providers=["cpu"]).run(None, feeds)
        errors.append(str(err.value))
    assert errors[0] == errors[1]


@pytest.mark.skipif(not jit.ENABLED, reason="numba not installed")
def test_compiled_hidden_quantisation_to_uint8_is_the_numpy_round_trip():
    """recurrent_vnni.quantize_rows_u8 (the tiles' hidden state): uint8 values whose
    difference from the zero point, times the scale, is _fake_quant's output bit for bit,
    with their sums; the chosen rows only; -1 for a value that is not finite."""
    from onnxep.providers_cpu.ops import recurrent_vnni

    rng = np.random.default_rng(12)
    cases = [rng.standard_normal((3, 17)).astype(np.float32) * s for s in (1e-3, 0.5, 40.0)]
    cases += [np.zeros((2, 5), np.float32), -np.abs(cases[1]), np.abs(cases[1])]
    cases += [np.full((1, 3), 0.25, np.float32), np.array([[1e-38, 3e-39, 0.0]], np.float32)]
    cases += [np.array([[-0.0, 3.0, -1e30, 1e30]], np.float32)]
    for h in cases:
        rows = np.arange(h.shape[0], dtype=np.int64)[::-1].copy()
        hq = np.full((h.shape[0], h.shape[1] + 3), 7, np.uint8)
        sums = np.zeros(h.shape[0], np.int32)
        scale, zp = recurrent_vnni.quantize_rows_u8(h, rows, h.shape[0], hq, sums)
        got = (hq[:, : h.shape[1]].astype(np.float32) - zp) * np.float32(scale)
        want = _fake_quant(h[rows])
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
        np.testing.assert_array_equal(sums, hq[:, : h.shape[1]].sum(axis=1))
        assert (hq[:, h.shape[1] :] == 7).all()  # the padding is not written
    h = np.array([[0.5, 1.0], [9.0, -9.0]], np.float32)  # row 1 left out
    hq, sums = np.zeros((2, 2), np.uint8), np.zeros(2, np.int32)
    scale, zp = recurrent_vnni.quantize_rows_u8(h, np.arange(2), 1, hq, sums)
    assert scale == np.float32(1) / np.float32(255) and zp == 0  # 9.0 and -9.0 not seen
    assert hq[0].tolist() == [np.rint(np.float32(0.5) / scale), 255] and sums[0] == hq[0].sum()
    for bad in (np.nan, np.inf, -np.inf):
        h = np.array([[0.5, bad]], np.float32)
        assert recurrent_vnni.quantize_rows_u8(h, np.arange(1), 1, hq, sums)[0] < 0


@needs_tiles
def test_tiles_loop_cache_name_carries_the_sources_digest(monkeypatch):
    """numba's disk cache checks only the caller's file: the tiles' LSTM loop is cached under
    a name made from jit_int8.py's and recurrent_loops.py's contents, so an edit to either
    names another cache entry."""
    from onnxep.providers_cpu.ops import recurrent_vnni

    loop = recurrent_vnni.loops().lstm_direction
    digest = recurrent_vnni.cache_digest()
    assert digest in loop.py_func.__qualname__
    monkeypatch.setattr(jit_int8, "_digest", "0" * 16)
    assert recurrent_vnni.cache_digest() != digest


@needs_tiles
@pytest.mark.parametrize("m", [1, 2, 3, 4, 6, 18])
@pytest.mark.parametrize(("k", "n"), [(256, 1024), (5, 17), (64, 65), (3, 200)])
def test_tiles_on_panels(m, k, n):
    """B in 64-column panels (PackedB(panels=True)): 1 to 4 row tiles, K not a multiple of 4,
    N past a panel (masked stores), uint8 B with per-column zero points: the integer
    definition, and the float epilogue bit for bit as on the row layout."""
    rng = np.random.default_rng(m * 100 + k + n)
    a = _extreme(rng, (m, k), U8)
    b = _extreme(rng, (k, n), U8 if n % 2 else I8)
    za, zb = _extreme(rng, (m,), U8), _extreme(rng, (n,), b.dtype)
    panels = vnni_gemm.PackedB(b, zb, panels=True)
    np.testing.assert_array_equal(vnni_gemm.matmul(a, za, panels), _packed_matmul_ref(a, za, b, zb))
    mult = rng.uniform(1e-3, 1e-2, n).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    rows = vnni_gemm.PackedB(b, zb)
    got = vnni_gemm.matmul(a, za, panels, mult, bias)
    assert got.tobytes() == vnni_gemm.matmul(a, za, rows, mult, bias).tobytes()


# -- the tiles: edges of their blocks, signs, zero points, threads -------------------------


def _packed_matmul_ref(a, za, b, zb):
    ai = a.astype(np.int64) - (0 if za is None else np.asarray(za, np.int64).reshape(-1, 1))
    return _wrap32(ai @ (b.astype(np.int64) - (0 if zb is None else np.asarray(zb, np.int64))))


@needs_tiles
@pytest.mark.parametrize("m", [1, 3, 4, 5, 9])
@pytest.mark.parametrize("k", [1, 3, 4, 5, 63, 64, 65, 257])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 64, 65, 130])
def test_tiles_cover_every_edge(m, k, n):
    """Rows past the 4-row tiles, columns past the 16-lane vectors and the 64-column tiles
    (masked stores), K not a multiple of 4 (zero padding): the integer definition."""
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a = _extreme(rng, (m, k), U8)
    b = _extreme(rng, (k, n), U8)
    za, zb = _extreme(rng, (m,), U8), _extreme(rng, (n,), U8)
    packed = vnni_gemm.PackedB(b, zb)
    np.testing.assert_array_equal(vnni_gemm.matmul(a, za, packed), _packed_matmul_ref(a, za, b, zb))


@needs_tiles
@pytest.mark.parametrize("a_dt,b_dt", [(U8, U8), (U8, I8), (I8, U8), (I8, I8)])
def test_tiles_move_signs_exactly(a_dt, b_dt):
    """int8 A (plus 128) and uint8 B (minus 128) reach vpdpbusd's uint8 x int8 with their
    zero points moved too; per-tensor and per-row/column zero points, batched A."""
    rng = np.random.default_rng(11)
    a = _extreme(rng, (2, 3, 70), a_dt)
    b = _extreme(rng, (70, 21), b_dt)
    for za, zb in [
        (None, None),
        (np.array(_extreme(rng, (), a_dt)), np.array(_extreme(rng, (), b_dt))),
        (_extreme(rng, (3,), a_dt), _extreme(rng, (21,), b_dt)),
    ]:
        got = vnni_gemm.matmul(a, za, vnni_gemm.PackedB(b, zb))
        want = np.stack([_packed_matmul_ref(a[i], za, b, zb) for i in range(2)])
        np.testing.assert_array_equal(got, want)


@needs_tiles
def test_tiles_wrap_as_int32():
    """70000 products of 255 * -128 and the zero-point terms pass 2^31: the int32 lanes wrap
    as an int32 accumulator does, with no bound to check."""
    k = 70000
    a = np.full((2, k), 255, np.uint8)
    b = np.full((k, 3), -128, np.int8)
    b[::5, 2] = 127
    za, zb = np.array(3, np.uint8), np.array(100, np.int8)
    got = vnni_gemm.matmul(a, za, vnni_gemm.PackedB(b, zb))
    want = _packed_matmul_ref(a, za, b, zb)
    assert np.abs((a.astype(np.int64) - 3) @ (b.astype(np.int64) - 100)).max() > 1 << 31
    np.testing.assert_array_equal(got, want)


@needs_tiles
@pytest.mark.parametrize("bias", [None, "vector"])
@pytest.mark.parametrize("per_column", [False, True])
def test_tiles_float_epilogue_is_cast_mul_add(bias, per_column):
    """float32(acc) * scale (+ bias) in the tiles is the float32 result of Cast, Mul, Add bit
    for bit, -0.0 included (a missing bias adds -0.0, which changes nothing)."""
    rng = np.random.default_rng(12)
    a = _extreme(rng, (7, 50), U8)
    b = _extreme(rng, (50, 37), I8)
    za, zb = np.array(a[0, 0]), _extreme(rng, (37,), I8)
    mult = rng.standard_normal(37 if per_column else 1).astype(np.float32) * 1e-3
    mult[0] = -mult[0] if per_column else mult[0]
    bv = None if bias is None else rng.standard_normal(37).astype(np.float32)
    packed = vnni_gemm.PackedB(b, zb)
    got = vnni_gemm.matmul(a, za, packed, mult, bv)
    acc = vnni_gemm.matmul(a, za, packed)
    want = acc.astype(np.float32) * (mult if per_column else mult.reshape(()))
    if bv is not None:
        want = want + bv
    assert got.dtype == np.float32
    assert got.tobytes() == want.tobytes()
    # a zero product times a negative scale is -0.0 in both
    zero = vnni_gemm.matmul(np.full((1, 50), 9, np.uint8), np.array(9), packed, -mult)
    assert zero.tobytes() == (np.zeros((1, 37), np.float32) * -mult).tobytes()


@needs_tiles
def test_tiles_split_over_threads_give_the_same_result(monkeypatch):
    """Large products split their columns (matmul) or positions (conv) over the run's threads:
    forced here on small ones, the results are the single-call ones."""
    rng = np.random.default_rng(13)
    a = _extreme(rng, (6, 300), U8)
    b = _extreme(rng, (300, 333), I8)
    x = _extreme(rng, (2, 5, 9, 11), U8)
    w = _extreme(rng, (70, 5, 3, 3), U8)
    attrs = {"pads": [1, 1, 1, 1]}
    zw = _extreme(rng, (70,), U8)
    want_mm = _packed_matmul_ref(a, None, b, None)
    want_conv = _conv_ref(x, 17, w, zw, attrs)
    monkeypatch.setattr(vnni_gemm, "PARALLEL_WORK", 0)
    monkeypatch.setattr("onnxep.providers_cpu.ops.nn_cpu._PARALLEL_MIN", 0)
    np.testing.assert_array_equal(vnni_gemm.matmul(a, None, vnni_gemm.PackedB(b, None)), want_mm)
    inputs = [("x", x), ("w", w), ("zx", np.array(17, np.uint8)), ("zw", zw)]
    np.testing.assert_array_equal(_ours("ConvInteger", inputs, {"w", "zw"}, attrs), want_conv)


CONV_EDGES = {
    "one-channel-stride2": (1, 7, 3, {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
    "three-channels-same": (3, 5, 3, {"pads": [1, 1, 1, 1]}),
    "five-channels-asymmetric": (5, 17, 3, {"pads": [0, 2, 1, 0]}),
    "dilated-strided": (8, 4, 3, {"pads": [2, 1, 2, 1], "dilations": [2, 2], "strides": [1, 2]}),
    "1x1-strided": (12, 33, 1, {"strides": [2, 3]}),
    "5x5-same": (4, 20, 5, {"pads": [2, 2, 2, 2]}),
    "kernel-wider-than-image": (2, 3, 5, {"pads": [3, 3, 3, 3]}),
    "2x2-no-pad": (6, 16, 2, {}),
}


@needs_tiles
@pytest.mark.parametrize("case", sorted(CONV_EDGES))
@pytest.mark.parametrize("x_dt,w_dt", [(U8, U8), (I8, I8)])
def test_tiles_convolutions(case, x_dt, w_dt):
    """The windows' layout on channels not a multiple of 4, taps outside the image on each
    side, strides, dilations, "same" convolutions (one loop over all rows of a tap) and
    others, per-channel zero points: the integer definition, and the tiles ran."""
    c, m, kk, attrs = CONV_EDGES[case]
    rng = np.random.default_rng(len(case))
    x = _extreme(rng, (2, c, 4, 5), x_dt)
    w = _extreme(rng, (m, c, kk, kk), w_dt)
    zx, zw = np.array(_extreme(rng, (), x_dt)), _extreme(rng, (m,), w_dt)
    inputs = [("x", x), ("w", w), ("zx", zx), ("zw", zw)]
    runs = []
    real = vnni_gemm.PackedConv.run
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vnni_gemm.PackedConv, "run", lambda *a: runs.append(1) or real(*a))
        got = _ours("ConvInteger", inputs, {"w", "zw"}, attrs)
    assert runs
    np.testing.assert_array_equal(got, _conv_ref(x, zx, w, zw, attrs))


@needs_tiles
def test_tiles_take_inputs_laid_out_otherwise():
    """A channels-last view (what QLinearConv's channels_last input and a Transpose give)
    and a transposed A: the same results as contiguous copies."""
    rng = np.random.default_rng(16)
    x = _extreme(rng, (2, 7, 6, 5), U8).transpose(0, 3, 1, 2)  # (2, 5, 7, 6), not contiguous
    w = _extreme(rng, (4, 5, 3, 3), I8)
    packed = vnni_gemm.PackedConv(w, np.int8(-3))
    geo = (3, 3, 1, 1, 1, 1, 1, 1)
    got = packed.run(x, 9, geo, (7, 6))
    np.testing.assert_array_equal(got, packed.run(np.ascontiguousarray(x), 9, geo, (7, 6)))
    np.testing.assert_array_equal(got, _conv_ref(x, 9, w, np.int8(-3), {"pads": [1, 1, 1, 1]}))
    a = _extreme(rng, (40, 3), U8).T
    b = _extreme(rng, (40, 6), U8)
    got = vnni_gemm.matmul(a, None, vnni_gemm.PackedB(b, None))
    np.testing.assert_array_equal(got, _packed_matmul_ref(a, None, b, None))


@needs_tiles
def test_the_tiles_run_the_products_when_here():
    calls = []
    real = vnni_gemm.matmul
    rng = np.random.default_rng(14)
    a, b = _extreme(rng, (3, 40), U8), _extreme(rng, (40, 5), U8)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vnni_gemm, "matmul", lambda *x, **k: calls.append(1) or real(*x, **k))
        got = _ours("MatMulInteger", [("a", a), ("b", b)], {"b"})
    assert calls
    np.testing.assert_array_equal(got, _packed_matmul_ref(a, None, b, None))


# -- DynamicQuantizeLinear, compiled and not ----------------------------------------------


def _dql_cases():
    rng = np.random.default_rng(15)
    big = rng.standard_normal(100003).astype(np.float32)
    halves = (np.arange(-600, 600, dtype=np.float32) + 0.5) / 2
    return {
        "activations": rng.standard_normal((1, 24, 32, 48)).astype(np.float32),
        "odd-size": big,
        "halves": halves,  # quotients at .5 round to even
        "all-negative": -np.abs(big[:77]),  # zero point 255
        "all-positive": np.abs(big[:77]) * 1e6,
        "zeros": np.zeros((3, 4), np.float32),
        "signed-zeros": np.array([-0.0, 0.0, -0.0], np.float32),
        "subnormals": np.array([1e-45, -3e-45, 0.0, 2e-44], np.float32),
        "extremes": np.array([3.4e38, -3.4e38, 1.0], np.float32),
        "empty": np.zeros(0, np.float32),
        "nan": np.array([0.5, np.nan, -1.0], np.float32),
        "inf": np.array([0.5, np.inf, -1.0], np.float32),
        "-inf": np.array([0.5, -np.inf, -1.0], np.float32),
        "float64": rng.standard_normal(50),
        "strided": rng.standard_normal((8, 9)).astype(np.float32)[:, ::2],
    }


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("case", sorted(_dql_cases()))
def test_dynamic_quantize_linear_paths_are_the_generic_kernel(case, compiled, monkeypatch):
    """The compiled range and quantize loops and the NumPy path: the generic kernel's bits
    (outputs, dtypes, shapes), NaN and infinities through NumPy's path in both."""
    from onnxep.providers.ops.op_dynamic_quantize_linear import dynamic_quantize_linear as generic
    from onnxep.providers_cpu.ops.op_dynamic_quantize_linear import dynamic_quantize_linear

    if compiled and not jit.ENABLED:
        pytest.skip("numba not installed")
    monkeypatch.setattr(jit, "ENABLED", compiled)
    x = _dql_cases()[case]
    with np.errstate(all="ignore"):
        got, want = dynamic_quantize_linear(None, np)(x), generic(None, np)(x)
    for g, w in zip(got, want):
        assert type(g) is type(w) and g.dtype == w.dtype and g.shape == w.shape
        assert g.tobytes() == w.tobytes(), (case, g, w)


@pytest.mark.skipif(not jit.ENABLED, reason="numba not installed")
@pytest.mark.parametrize("case", ["activations", "halves", "all-negative", "zeros", "odd-size"])
def test_dynamic_uint8_compiled_is_its_numpy_path(case, monkeypatch):
    """DynamicQuantizeMatMul's (and the LSTM's) quantization: the compiled pass and the NumPy
    one agree (scale 1 for a zero range, an int zero point)."""
    from onnxep.providers_cpu.ops.qlinear import dynamic_uint8

    x = _dql_cases()[case]
    fast = dynamic_uint8(x)
    monkeypatch.setattr(jit, "ENABLED", False)
    slow = dynamic_uint8(x)
    assert fast[0].tobytes() == slow[0].tobytes()
    assert np.float32(fast[1]).tobytes() == np.float32(slow[1]).tobytes()
    assert fast[2] == slow[2] and type(fast[2]) is int


@pytest.mark.parametrize("bad", [None, np.inf, np.nan])
def test_dynamic_quantize_matmul_in_one_call_and_its_fallback(bad, monkeypatch):
    """DynamicQuantizeMatMul quantizes, multiplies and scales in one compiled call on the
    tiles; a NaN or infinity in A goes to the NumPy path, as numba off does (whose zero
    point from a NaN range is an error, as it was before the tiles)."""
    rng = np.random.default_rng(17)
    a = rng.standard_normal((3, 4, 37)).astype(np.float32)
    if bad is not None:
        a[1, 2, 5] = bad
    b = _extreme(rng, (37, 19), U8)
    node = helper.make_node(
        "DynamicQuantizeMatMul", ["a", "b", "bs", "bz", "bias"], ["y"], domain="com.microsoft"
    )
    consts = {
        "b": b,
        "bs": rng.uniform(0.001, 0.01, 19).astype(np.float32),
        "bz": _extreme(rng, (19,), U8),
        "bias": rng.standard_normal(19).astype(np.float32),
    }
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("a", elem(np.float32), a.shape)],
        [helper.make_tensor_value_info("y", elem(np.float32), None)],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        ir_version=10,
    )

    def run():
        with np.errstate(all="ignore"):
            sess = onnxep.InferenceSession(model, providers=["cpu"])
            try:
                return sess.run(None, {"a": a})[0].tobytes()
            except OnnxepError as exc:
                return str(exc.__cause__ or exc)

    got = run()
    monkeypatch.setattr(jit, "ENABLED", False)
    assert got == run()


@needs_tiles
@pytest.mark.parametrize("fed", [(), ("bs",), ("bias",), ("bs", "bias")])
def test_dynamic_quantize_matmul_scale_and_bias_fed_or_constant(fed, monkeypatch):
    """The tiles' padded scale and bias are made once per session only when both are
    constants: fed ones, changed between runs, give each run's own result (the NumPy
    path's, numba off)."""
    rng = np.random.default_rng(18)
    b = _extreme(rng, (40, 21), I8)
    node = helper.make_node(
        "DynamicQuantizeMatMul", ["a", "b", "bs", "bz", "bias"], ["y"], domain="com.microsoft"
    )
    consts = {"b": b, "bz": np.array(3, np.int8)}
    fixed = {"bs": np.float32(0.02), "bias": rng.standard_normal(21).astype(np.float32)}
    consts |= {k: v for k, v in fixed.items() if k not in fed}
    g_in = [helper.make_tensor_value_info("a", elem(np.float32), None)]
    g_in += [helper.make_tensor_value_info(k, elem(np.float32), None) for k in fed]
    graph = helper.make_graph(
        [node],
        "g",
        g_in,
        [helper.make_tensor_value_info("y", elem(np.float32), None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
        ir_version=10,
    )
    feeds = [
        {"a": rng.standard_normal((2, 3, 40)).astype(np.float32)}
        | {k: (np.asarray(fixed[k]) * (i + 1)).astype(np.float32) for k in fed}
        for i in range(3)
    ]
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    got = [sess.run(None, f)[0] for f in feeds]
    monkeypatch.setattr(jit, "ENABLED", False)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    for g, f in zip(got, feeds):
        np.testing.assert_allclose(g, sess.run(None, f)[0], rtol=1e-6, atol=1e-6)


# -- DequantizeLinear of 8-bit values by constant per-tensor parameters: a table ----------


def _dequantize_model(x_dt, scale, zp, const=True, axis=None):
    ins = ["x", "s"] + (["z"] if zp is not None else [])
    arrays = {"s": np.asarray(scale)} | ({} if zp is None else {"z": np.asarray(zp, x_dt)})
    attrs = {} if axis is None else {"axis": axis}
    node = helper.make_node("DequantizeLinear", ins, ["y"], **attrs)
    g_in = [helper.make_tensor_value_info("x", elem(np.dtype(x_dt)), None)]
    if not const:
        g_in += [
            helper.make_tensor_value_info(n, elem(a.dtype), a.shape) for n, a in arrays.items()
        ]
    inits = [numpy_helper.from_array(a, n) for n, a in arrays.items()] if const else []
    out = [helper.make_tensor_value_info("y", elem(np.float32), None)]
    graph = helper.make_graph([node], "g", g_in, out, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    return model, ({} if const else arrays)


@pytest.mark.parametrize("x_dt", [U8, I8])
@pytest.mark.parametrize(
    "scale", [np.float32(0.0123), np.array([3e-3], np.float32), np.float32(-2.5), np.float32(1e-40)]
)
@pytest.mark.parametrize("zp", [None, 0, 17, "top"])
def test_dequantize_linear_table_is_the_generic_kernel(x_dt, scale, zp, monkeypatch):
    """Constant per-tensor scale and zero point of 8-bit x: the table's values are the
    generic kernel's float32 operations bit for bit (a negative and a subnormal scale
    included), on every byte value, on a strided x, and onnxruntime's."""
    from onnxep.providers_cpu.ops import op_dequantize_linear

    tables = []
    real = op_dequantize_linear._table  # noqa: SLF001

    def spy(node):
        tables.append(real(node))
        return tables[-1]

    monkeypatch.setattr(op_dequantize_linear, "_table", spy)
    if zp == "top":
        zp = np.iinfo(x_dt).max
    if zp is not None:
        zp = np.asarray(zp, x_dt).reshape(np.shape(scale))
    model, _ = _dequantize_model(x_dt, scale, zp)
    every = np.arange(256, dtype=np.uint8).view(x_dt).reshape(2, 8, 16)
    for x in (every, every[:, ::3, 1:]):
        got, ref = run_both(model, {"x": x})
        assert tables and tables[-1] is not None
        v = x.astype(np.float32) - (np.float32(0) if zp is None else zp.astype(np.float32))
        want = (v * np.asarray(scale, np.float32)).astype(np.float32)
        assert got[0].dtype == np.float32 and got[0].shape == x.shape
        assert got[0].tobytes() == want.tobytes()
        np.testing.assert_array_equal(got[0], ref[0])


@pytest.mark.parametrize("case", ["per_axis", "fed", "int16", "0-d"])
def test_dequantize_linear_other_cases_keep_the_generic_kernel(case):
    """Per-axis parameters, parameters fed at run time, 16-bit x and a 0-d x are not the
    table's: onnxruntime's results as before."""
    rng = np.random.default_rng(3)
    x_dt = np.dtype(np.int16) if case == "int16" else U8
    x = rng.integers(0, 200, () if case == "0-d" else (3, 4, 5)).astype(x_dt)
    if case == "per_axis":
        scale, zp = rng.uniform(0.01, 0.1, 4).astype(np.float32), np.arange(4).astype(x_dt)
    else:
        scale, zp = np.float32(0.05), np.asarray(7, x_dt)
    model, fed = _dequantize_model(x_dt, scale, zp, const=case != "fed", axis=1)
    got, ref = run_both(model, {"x": x} | fed)
    assert got[0].shape == ref[0].shape
    np.testing.assert_array_equal(got[0], ref[0])
