"""Elementwise kernels on cases the ONNX node suite leaves out.

Legacy (opset < 7) broadcasting, narrow float dtypes, integer Div/Pow edge
cases, string casts, BitCast of sub-byte types, and erf's accuracy.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxep
from onnxep.providers.dtypes import elem_type
from onnxep.providers.ops import elementwise as ew

BF16 = np.dtype(ml_dtypes.bfloat16)


def run_node(op, inputs, attrs=None, opset=21, out_dtype=None):
    """Run a one-node model; ``inputs`` is a list of arrays, returns output 0."""
    names = [f"x{i}" for i in range(len(inputs))]
    node = helper.make_node(op, names, ["y"], **(attrs or {}))
    g_in = [
        helper.make_tensor_value_info(n, elem_type(a.dtype), list(a.shape))
        for n, a in zip(names, inputs)
    ]
    odt = out_dtype if out_dtype is not None else inputs[0].dtype
    g_out = [helper.make_tensor_value_info("y", elem_type(odt), None)]
    graph = helper.make_graph([node], "g", g_in, g_out)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    return sess.run(None, dict(zip(names, inputs)))[0]


def test_legacy_broadcast_axis():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    b = np.array([10, 20, 30], dtype=np.float32)
    y = run_node("Add", [a, b], {"broadcast": 1, "axis": 1}, opset=6)
    np.testing.assert_array_equal(y, a + b.reshape(3, 1))


def test_legacy_broadcast_suffix():
    a = np.ones((2, 3), dtype=np.float32)
    b = np.array([1, 2, 3], dtype=np.float32)
    np.testing.assert_array_equal(run_node("Mul", [a, b], {"broadcast": 1}, opset=6), a * b)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Mod"])
def test_bfloat16_binary_keeps_dtype(op):
    a = np.array([1.5, -2.0, 3.25], dtype=BF16)
    b = np.array([2.0, 3.0, 1.5], dtype=BF16)
    y = run_node(op, [a, b])
    assert y.dtype == BF16
    assert np.all(np.isfinite(y.astype(np.float32)))


@pytest.mark.parametrize(
    "op",
    ["Sin", "Exp", "Tanh", "Relu", "Sigmoid", "Erf", "Gelu", "Softplus", "Abs", "Neg", "Sqrt"],
)
def test_bfloat16_unary_keeps_dtype(op):
    x = np.array([0.25, 1.5, 2.0], dtype=BF16)
    assert run_node(op, [x]).dtype == BF16


def test_int_div_truncates():
    a = np.array([7, -7, 7, -7, 6], dtype=np.int32)
    b = np.array([2, 2, -2, -2, 3], dtype=np.int32)
    np.testing.assert_array_equal(run_node("Div", [a, b]), [3, -3, -3, 3, 2])


def test_int_pow_negative_exponent():
    x = np.array([2, 1, -1, -1, 3], dtype=np.int64)
    y = np.array([-1, -3, -3, -2, 2], dtype=np.int64)
    np.testing.assert_array_equal(run_node("Pow", [x, y]), [0, 1, -1, 1, 9])


def test_pow_int_base_float_exponent_keeps_base_dtype():
    x = np.array([4, 9], dtype=np.int32)
    y = np.array([0.5, 0.5], dtype=np.float32)
    z = run_node("Pow", [x, y])
    assert z.dtype == np.int32
    np.testing.assert_array_equal(z, [2, 3])


def test_scalar_results_are_arrays():
    y = run_node("Add", [np.array(1.0, np.float32), np.array(2.0, np.float32)])
    assert isinstance(y, np.ndarray) and y.shape == ()


def test_clip_opset6_attributes():
    x = np.array([-3.0, 0.5, 3.0], dtype=np.float32)
    np.testing.assert_array_equal(
        run_node("Clip", [x], {"min": -1.0, "max": 1.0}, opset=6), [-1, 0.5, 1]
    )


def test_cast_opset1_string_to():
    x = np.array([1.7, -2.2], dtype=np.float32)
    y = run_node("Cast", [x], {"to": "INT32"}, opset=1, out_dtype=np.int32)
    np.testing.assert_array_equal(y, [1, -2])


def test_cast_string_to_float_and_back():
    s = np.array(["3.5", "-INF", "NaN", "1e-5", "+inf"], dtype=object)
    f = run_node("Cast", [s], {"to": TensorProto.FLOAT}, out_dtype=np.float32)
    np.testing.assert_array_equal(f[[0, 1, 3, 4]], np.float32([3.5, -np.inf, 1e-5, np.inf]))
    assert np.isnan(f[2])
    back = run_node(
        "Cast", [np.float32([0.1, np.inf])], {"to": TensorProto.STRING}, out_dtype=object
    )
    assert back.tolist() == ["0.1", "INF"]


def test_cast_string_to_int():
    s = np.array(["12", "-3", "100.5"], dtype=object)
    y = run_node("Cast", [s], {"to": TensorProto.INT64}, out_dtype=np.int64)
    np.testing.assert_array_equal(y, [12, -3, 100])


def test_cast_float8_saturates():
    x = np.float32([1e6, -1e6, np.inf, 1.0])
    to = TensorProto.FLOAT8E4M3FN
    dt = np.dtype(ml_dtypes.float8_e4m3fn)
    y = run_node("Cast", [x], {"to": to}, out_dtype=dt).astype(np.float32)
    np.testing.assert_array_equal(y, [448, -448, 448, 1])
    y = run_node("Cast", [x], {"to": to, "saturate": 0}, out_dtype=dt).astype(np.float32)
    assert np.isnan(y[:3]).all()


@pytest.mark.parametrize(
    ("mode", "expect"), [("up", [1, 4, 4]), ("down", [1, 2, 2]), ("nearest", [1, 2, 4])]
)
def test_cast_e8m0_round_modes(mode, expect):
    dt = np.dtype(ml_dtypes.float8_e8m0fnu)
    x = np.float32([1.0, 2.5, 3.5])
    y = run_node(
        "Cast", [x], {"to": TensorProto.FLOAT8E8M0, "round_mode": mode}, opset=25, out_dtype=dt
    )
    np.testing.assert_array_equal(y.astype(np.float32), expect)


def test_bitcast_int4_to_uint4():
    x = np.array([-1, 7, -8], dtype=ml_dtypes.int4)
    y = run_node(
        "BitCast", [x], {"to": TensorProto.UINT4}, opset=26, out_dtype=np.dtype(ml_dtypes.uint4)
    )
    np.testing.assert_array_equal(y.astype(np.int32), [15, 7, 8])


def test_bitshift_out_of_range_shifts():
    x = np.array([-8, 8, -8, 8], dtype=np.int32)
    y = np.array([40, 40, -1, 1], dtype=np.int32)
    np.testing.assert_array_equal(
        run_node("BitShift", [x, y], {"direction": "RIGHT"}, opset=28), [-1, 0, -1, 4]
    )


def test_erf_accuracy():
    xs = np.concatenate([np.linspace(-7, 7, 20001), np.logspace(-30, 0.8, 500)])
    ref = np.array([math.erf(v) for v in xs])
    got = ew.erf(np, xs)
    np.testing.assert_allclose(got, ref, rtol=2e-15, atol=0)
    got32 = ew.erf(np, xs.astype(np.float32))
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, ref, rtol=3e-7, atol=1e-37)
    special = ew.erf(np, np.array([np.inf, -np.inf, np.nan, -0.0]))
    assert special[0] == 1 and special[1] == -1 and np.isnan(special[2]) and special[3] == 0


@pytest.mark.parametrize("dt", [BF16, np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(np.float16)])
def test_predicates_return_bool(dt):
    x = np.array([1.0, np.nan, np.inf, -np.inf], dtype=np.float32).astype(dt)
    nan = run_node("IsNaN", [x], out_dtype=np.bool_)
    assert nan.dtype == np.bool_ and nan.tolist()[:2] == [False, True]
    inf = run_node("IsInf", [x], {"detect_negative": 0}, out_dtype=np.bool_)
    assert inf.dtype == np.bool_ and not inf[0] and not inf[1]


def test_where_on_strings():
    c = np.array([True, False])
    a = np.array(["a", "b"], dtype=object)
    b = np.array(["c", "d"], dtype=object)
    assert run_node("Where", [c, a, b], out_dtype=object).tolist() == ["a", "d"]
