"""The CPU provider's Relu, Clip, LeakyRelu and PRelu (providers_cpu/ops/op_relu.py, ...):
NumPy 2.4's scalar ``maximum``/``minimum`` and its ``where`` are slow loops, so these run
through the ``clip`` ufunc and max/min of the product; the values must stay the spec's.

Every case is checked against onnx's reference evaluator and onnxruntime, element by
element exactly (NaN where they have NaN), on inputs with NaN, infinities, signed zeros
and random signs (onnxruntime on the finite inputs), in float32 and float64, and in
float16 and int32 where the op takes them (the generic kernels' path; float16 within its
rounding, as the generic kernels compute it in float32)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxep

ort = pytest.importorskip("onnxruntime")

_T = {
    np.float32: TensorProto.FLOAT,
    np.float64: TensorProto.DOUBLE,
    np.float16: TensorProto.FLOAT16,
    np.int32: TensorProto.INT32,
}


def _x(dtype, shape=(2, 3, 17, 19)) -> np.ndarray:
    rng = np.random.default_rng(0)
    if np.dtype(dtype).kind == "i":
        return rng.integers(-50, 50, size=shape).astype(dtype)
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    flat = x.reshape(-1)
    flat[:8] = [
        np.nan,
        -0.0,
        0.0,
        np.inf,
        -np.inf,
        6.0,
        -1e-30,
        1e30 if dtype != np.float16 else 1e4,
    ]
    return x


def _model(op, inputs, attrs, opset, consts=(), dtype=np.float32):
    node = helper.make_node(op, [n for n, _ in inputs] + [n for n, _ in consts], ["y"], **attrs)
    t = _T[dtype]
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, t, list(v.shape)) for n, v in inputs],
        [helper.make_tensor_value_info("y", t, None)],
        [numpy_helper.from_array(v, n) for n, v in consts],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _check(model: onnx.ModelProto, feeds: dict) -> None:
    raw = model.SerializeToString()
    ours = onnxep.InferenceSession(raw, providers=["cpu"])
    got = ours.run(None, feeds)[0]
    got2 = ours.run(None, feeds)[0]  # the executor's direct path from the second run
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    peer = ort.InferenceSession(raw, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    # onnxruntime's Clip without a bound clips to the type's largest finite value, so an
    # infinite input is compared with the reference evaluator only.
    finite = np.isfinite(feeds["x"]) if feeds["x"].dtype.kind == "f" else True
    same = np.testing.assert_array_equal  # NaN where NaN, -0 == +0
    if want.dtype == np.float16:

        def same(a, b):
            np.testing.assert_allclose(a, b, rtol=1e-3, atol=0)

    for g in (got, got2):
        assert g.dtype == want.dtype and g.shape == want.shape
        same(g, want)
        same(np.where(finite, g, 0), np.where(finite, peer, 0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32])
def test_relu(dtype):
    x = _x(dtype)
    _check(_model("Relu", [("x", x)], {}, 14, dtype=dtype), {"x": x})


def test_relu_turns_negative_zero_into_positive_zero():
    x = np.array([-0.0, 0.0, -1.0, np.nan], np.float32)
    y = onnxep.InferenceSession(
        _model("Relu", [("x", x)], {}, 14).SerializeToString(), providers=["cpu"]
    ).run(None, {"x": x})[0]
    assert not np.signbit(y[:3]).any() and np.isnan(y[3])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size", [0, 1, 5, 16, 127, 1024, 1025, 5000])
def test_relu_small_and_large_the_same_bits(dtype, size):
    # up to op_relu.SMALL values one np.maximum, past it clip + 0: the same bits either way
    from onnxep.providers_cpu.ops import op_relu
    from onnxep.providers_cpu.ops.ufuncs import clip_ufunc

    base = np.array([-0.0, 0.0, np.nan, -np.nan, np.inf, -np.inf, 1e-45, -1e-45, 3.5, -2.0])
    x = np.resize(base, size).astype(dtype).reshape(1, size)
    want = clip_ufunc(x, 0, np.inf) + 0.0
    relu = op_relu._relu  # noqa: SLF001  (the direct call the plan makes)
    got = relu(x)
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    if size:
        strided = np.resize(base, 2 * size).astype(dtype)[::2]
        want = clip_ufunc(strided, 0, np.inf) + 0.0
        assert relu(strided).tobytes() == want.tobytes()


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int32])
@pytest.mark.parametrize(
    "bounds", [(0, 6), (-1, None), (None, 2), (None, None), (3, 1), (0, np.inf), (-np.inf, 1)]
)
def test_clip_bounds_as_inputs(dtype, bounds):
    if np.dtype(dtype).kind == "i" and any(b is not None and not np.isfinite(b) for b in bounds):
        pytest.skip("an integer Clip has finite bounds")
    x = _x(dtype)
    lo, hi = bounds
    names = [("lo", lo), ("hi", hi)]
    consts = [(n, np.array(v, dtype)) for n, v in names if v is not None]
    node_inputs = ["x", "lo" if lo is not None else "", "hi" if hi is not None else ""]
    while node_inputs[-1] == "":
        node_inputs.pop()
    model = _model("Clip", [("x", x)], {}, 13, consts=consts, dtype=dtype)
    del model.graph.node[0].input[:]
    model.graph.node[0].input.extend(node_inputs)
    _check(model, {"x": x})


def test_clip_bounds_fed_at_run_time():
    x = _x(np.float32)
    node = helper.make_node("Clip", ["x", "lo", "hi"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape)),
            helper.make_tensor_value_info("lo", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("hi", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    for lo, hi in [(-1.0, 1.0), (2.0, -2.0), (0.0, 6.0)]:
        _check(model, {"x": x, "lo": np.array(lo, np.float32), "hi": np.array(hi, np.float32)})


@pytest.mark.parametrize("attrs", [{"min": 0.0, "max": 6.0}, {"min": -2.5}, {}])
def test_clip_opset_6_attributes(attrs):
    """A missing bound is float's lowest or largest finite value there, as the spec says:
    infinities are clipped to them. (onnxruntime has no float64 Clip-6.)"""
    x = _x(np.float32)
    _check(_model("Clip", [("x", x)], attrs, 6), {"x": x})


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
@pytest.mark.parametrize("alpha", [0.01, 0.2, 1.0, 3.0, -0.5, 0.0])
def test_leaky_relu(dtype, alpha):
    x = _x(dtype)
    _check(_model("LeakyRelu", [("x", x)], {"alpha": alpha}, 16, dtype=dtype), {"x": x})


@pytest.mark.parametrize(
    "slope",
    [
        np.full((3, 1, 1), 0.25),  # per channel, all below 1: max
        np.array([[[0.1]], [[1.0]], [[0.7]]]),
        np.full((3, 1, 1), 2.0),  # all above 1: min
        np.array([[[0.1]], [[2.0]], [[0.7]]]),  # mixed: the generic kernel
        np.array([[[0.0]], [[0.5]], [[0.7]]]),  # a zero slope: the generic kernel
        np.array(0.3),
        np.linspace(-0.5, 0.9, 19),  # along the last axis
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_p_relu_constant_slope(slope, dtype):
    x = _x(dtype)
    model = _model("PRelu", [("x", x)], {}, 16, consts=[("s", slope.astype(dtype))], dtype=dtype)
    _check(model, {"x": x})


def test_p_relu_fed_slope():
    x = _x(np.float32)
    node = helper.make_node("PRelu", ["x", "s"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape)),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, [3, 1, 1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])
    for s in ([0.2, 0.5, 0.9], [1.5, 2.0, 3.0], [0.2, 2.0, 0.5], [0.0, 0.1, 0.2]):
        _check(model, {"x": x, "s": np.array(s, np.float32).reshape(3, 1, 1)})
