"""onnxruntime parity for the com.microsoft quantized kernels (QLinear*, QGemm, integer matmuls).

Every case builds a one-node model with onnx.helper, scales and zero points as initializers
(or graph inputs where the kernel must read them per run), and compares onnxep's CPU
provider with onnxruntime's CPU provider on random 8-bit data that spans the whole range, so
saturation at both ends is exercised. Quantized outputs must match exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from contrib_cases import MS, check, elem, run_both
from onnx import numpy_helper

pytest.importorskip("onnxruntime")

INTS = [np.uint8, np.int8]


def q(rng, shape, dt):
    info = np.iinfo(dt)
    return rng.integers(info.min, info.max + 1, shape, dtype=dt)


def f32(v):
    return np.asarray(v, np.float32)


def zp(dt, unsigned, signed):
    return np.asarray(unsigned if np.dtype(dt) == np.uint8 else signed, dt)


BINARY_SHAPES = [((3, 4, 5), (3, 4, 5)), ((3, 4, 5), (4, 1)), ((1,), (2, 7)), ((2, 1, 6), (3, 1))]


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dt", INTS)
@pytest.mark.parametrize("shapes", BINARY_SHAPES)
@pytest.mark.parametrize("const_params", [True, False])
def test_qlinear_binary(op, dt, shapes, const_params):
    rng = np.random.default_rng(len(shapes[0]) + len(shapes[1]))
    c_scale = 0.05 if op == "QLinearAdd" else 0.3
    inputs = [
        ("a", q(rng, shapes[0], dt)),
        ("a_scale", f32(0.02)),
        ("a_zp", zp(dt, 3, -3)),
        ("b", q(rng, shapes[1], dt)),
        ("b_scale", f32(0.035)),
        ("b_zp", zp(dt, 130, 2)),
        ("c_scale", f32(c_scale)),
        ("c_zp", zp(dt, 120, -5)),
    ]
    consts = {n for n, _ in inputs if "_" in n} if const_params else set()
    check(op, inputs, [("c", dt)], consts=consts)


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_qlinear_binary_omitted_output_zero_point(op):
    rng = np.random.default_rng(1)
    inputs = [
        ("a", q(rng, (6, 5), np.uint8)),
        ("a_scale", f32(0.01)),
        ("a_zp", np.asarray(0, np.uint8)),
        ("b", q(rng, (5,), np.uint8)),
        ("b_scale", f32(0.02)),
        ("b_zp", np.asarray(9, np.uint8)),
        ("c_scale", f32(0.04)),
    ]
    check(op, inputs, [("c", np.uint8)], consts={n for n, _ in inputs if "_" in n})


@pytest.mark.parametrize("seed", range(8))
def test_qlinear_add_random_scales(seed):
    """Random scales and zero points: the fused float32 evaluation rounds as onnxruntime's."""
    rng = np.random.default_rng(100 + seed)
    dt = INTS[seed % 2]
    s_a, s_b, s_c = (np.float32(rng.uniform(0.004, 0.2)) for _ in range(3))
    inputs = [("a", q(rng, (515,), dt)), ("a_scale", f32(s_a)), ("a_zp", q(rng, (), dt))]
    inputs += [("b", q(rng, (515,), dt)), ("b_scale", f32(s_b)), ("b_zp", q(rng, (), dt))]
    inputs += [("c_scale", f32(s_c)), ("c_zp", q(rng, (), dt))]
    check("QLinearAdd", inputs, [("c", dt)], consts={n for n, _ in inputs if "_" in n})


@pytest.mark.parametrize("op,attrs", [("QLinearSigmoid", {}), ("QLinearLeakyRelu", {"alpha": 0.1})])
@pytest.mark.parametrize("dt", INTS)
@pytest.mark.parametrize("const_params", [True, False])
def test_qlinear_lookup_activations(op, attrs, dt, const_params):
    rng = np.random.default_rng(2)
    y_scale, y_zp = (1 / 256, zp(dt, 0, -128)) if op == "QLinearSigmoid" else (0.03, zp(dt, 9, -9))
    inputs = [
        ("x", q(rng, (4, 64), dt)),
        ("x_scale", f32(0.05)),
        ("x_zp", zp(dt, 140, 7)),
        ("y_scale", f32(y_scale)),
        ("y_zp", y_zp),
    ]
    consts = {"x_scale", "x_zp", "y_scale", "y_zp"} if const_params else set()
    check(op, inputs, [("y", dt)], attrs, consts)


@pytest.mark.parametrize("dt", INTS)
@pytest.mark.parametrize(
    "shape,opset,axis",
    [
        ((2, 3, 10), 13, -1),
        ((2, 3, 10), 13, 1),
        ((2, 3, 10), 12, 1),
        ((4, 50), 13, -1),
        ((5, 1), 13, 0),
    ],
)
@pytest.mark.parametrize("x_scale", [0.1, 0.02, 1.5])
def test_qlinear_softmax(dt, shape, opset, axis, x_scale):
    rng = np.random.default_rng(3)
    inputs = [
        ("x", q(rng, shape, dt)),
        ("x_scale", f32(x_scale)),
        ("x_zp", zp(dt, 3, 3)),
        ("y_scale", f32(1 / 256)),
        ("y_zp", zp(dt, 0, -128)),
    ]
    check(
        "QLinearSoftmax",
        inputs,
        [("y", dt)],
        {"opset": opset, "axis": axis},
        {"x_scale", "x_zp", "y_scale", "y_zp"},
    )


@pytest.mark.parametrize("dt", INTS)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_qlinear_concat(dt, axis):
    rng = np.random.default_rng(4)
    shapes = [(2, 3, 4), (2, 3, 4), (2, 3, 4)]
    inputs = [("y_scale", f32(0.05)), ("y_zp", zp(dt, 128, 0))]
    # the first input already has Y's parameters (copied), the others are requantized
    params = [(0.05, zp(dt, 128, 0)), (0.02, zp(dt, 100, -7)), (0.11, zp(dt, 250, 120))]
    for i, (shape, (s, z)) in enumerate(zip(shapes, params)):
        inputs += [(f"x{i}", q(rng, shape, dt)), (f"s{i}", f32(s)), (f"z{i}", z)]
    consts = {n for n, _ in inputs if not n.startswith("x")}
    check("QLinearConcat", inputs, [("y", dt)], {"axis": axis}, consts)


@pytest.mark.parametrize("dt", INTS)
@pytest.mark.parametrize("same", [False, True])
def test_qlinear_where(dt, same):
    rng = np.random.default_rng(5)
    inputs = [
        ("cond", rng.random((3, 1, 5)) > 0.5),
        ("x", q(rng, (3, 4, 5), dt)),
        ("x_scale", f32(0.05 if same else 0.02)),
        ("x_zp", zp(dt, 128 if same else 7, 0 if same else -9)),
        ("y", q(rng, (4, 1), dt)),
        ("y_scale", f32(0.09)),
        ("y_zp", zp(dt, 30, 30)),
        ("z_scale", f32(0.05)),
        ("z_zp", zp(dt, 128, 0)),
    ]
    check("QLinearWhere", inputs, [("z", dt)], consts={n for n, _ in inputs if "_" in n})


@pytest.mark.parametrize("dt", INTS)
@pytest.mark.parametrize("shape,last", [((2, 3, 5, 7), 0), ((2, 5, 7, 3), 1), ((1, 8, 9), 0)])
def test_qlinear_global_average_pool(dt, shape, last):
    rng = np.random.default_rng(6)
    inputs = [
        ("x", q(rng, shape, dt)),
        ("x_scale", f32(0.07)),
        ("x_zp", zp(dt, 120, 4)),
        ("y_scale", f32(0.01)),
        ("y_zp", zp(dt, 128, -3)),
    ]
    consts = {"x_scale", "x_zp", "y_scale", "y_zp"}
    check("QLinearGlobalAveragePool", inputs, [("y", dt)], {"channels_last": last}, consts)


def _per(rng, n, per_column, lo, hi, dtype):
    shape = (n,) if per_column else ()
    if np.dtype(dtype).kind == "f":
        return rng.uniform(lo, hi, shape).astype(dtype)
    return rng.integers(lo, hi, shape).astype(dtype)


@pytest.mark.parametrize(
    "a_dt,b_dt", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)]
)
@pytest.mark.parametrize("trans", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("out", ["quantized", "float"])
@pytest.mark.parametrize("bias", ["none", "row", "full"])
def test_qgemm(a_dt, b_dt, trans, per_column, out, bias):
    rng = np.random.default_rng(7)
    m, k, n = 5, 7, 6
    a = q(rng, (k, m) if trans[0] else (m, k), a_dt)
    b = q(rng, (n, k) if trans[1] else (k, n), b_dt)
    b_zero = 0 if np.dtype(b_dt) == np.int8 else 120
    inputs = [("a", a), ("a_scale", f32(0.03)), ("a_zp", zp(a_dt, 128, 1)), ("b", b)]
    inputs += [("b_scale", _per(rng, n, per_column, 0.01, 0.05, np.float32))]
    inputs += [("b_zp", _per(rng, n, per_column, b_zero, b_zero + 1, b_dt))]
    c = {
        "none": None,
        "row": rng.integers(-500, 500, (n,)),
        "full": rng.integers(-500, 500, (m, n)),
    }
    inputs.append(("c", c[bias].astype(np.int32)) if c[bias] is not None else ("", None))
    if out == "quantized":
        inputs += [("y_scale", f32(0.5)), ("y_zp", zp(a_dt, 128, -2))]
    y_dt = a_dt if out == "quantized" else np.float32
    attrs = {"transA": trans[0], "transB": trans[1], "alpha": 0.75}
    consts = {n for n, _ in inputs if n not in ("a", "b")}
    check("QGemm", inputs, [("y", y_dt)], attrs, consts, rtol=1e-6)


MM_SHAPES = [((4, 8), (8, 5)), ((2, 3, 8), (8, 5)), ((2, 3, 8), (2, 8, 5)), ((8,), (8, 3))]


@pytest.mark.parametrize("shapes", MM_SHAPES)
@pytest.mark.parametrize("b_dt", [np.uint8, np.int8])
@pytest.mark.parametrize("with_zp", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("const_b", [True, False])
def test_dynamic_quantize_matmul(shapes, b_dt, with_zp, with_bias, const_b):
    rng = np.random.default_rng(8)
    n = shapes[1][-1]
    inputs = [
        ("a", rng.standard_normal(shapes[0]).astype(np.float32)),
        ("b", q(rng, shapes[1], b_dt)),
    ]
    inputs.append(("b_scale", f32(0.02)))
    inputs.append(("b_zp", zp(b_dt, 130, 3)) if with_zp else ("", None))
    inputs.append(("bias", rng.standard_normal(n).astype(np.float32)) if with_bias else ("", None))
    consts = {"b_scale", "b_zp", "bias"} | ({"b"} if const_b else set())
    check("DynamicQuantizeMatMul", inputs, [("y", np.float32)], consts=consts, atol=1e-5, rtol=1e-5)


def test_dynamic_quantize_matmul_all_zero_and_positive_inputs():
    rng = np.random.default_rng(9)
    b = q(rng, (6, 4), np.int8)
    for a in (np.zeros((3, 6), np.float32), rng.uniform(0.5, 2.0, (3, 6)).astype(np.float32)):
        inputs = [("a", a), ("b", b), ("b_scale", f32(0.1))]
        check(
            "DynamicQuantizeMatMul", inputs, [("y", np.float32)], consts={"b", "b_scale"}, rtol=1e-6
        )


@pytest.mark.parametrize("shapes", MM_SHAPES)
@pytest.mark.parametrize(
    "a_dt,b_dt", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)]
)
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matmul_integer_to_float(shapes, a_dt, b_dt, per_column, with_bias):
    if per_column and len(shapes[1]) > 2:
        pytest.skip("onnxruntime takes per-column parameters for a 2-D B only")
    rng = np.random.default_rng(10)
    n = shapes[1][-1]
    b_zero = 128 if np.dtype(b_dt) == np.uint8 else -4
    inputs = [("a", q(rng, shapes[0], a_dt)), ("b", q(rng, shapes[1], b_dt))]
    inputs += [
        ("a_scale", f32(0.04)),
        ("b_scale", _per(rng, n, per_column, 0.01, 0.05, np.float32)),
    ]
    inputs += [
        ("a_zp", zp(a_dt, 120, 2)),
        ("b_zp", _per(rng, n, per_column, b_zero, b_zero + 2, b_dt)),
    ]
    inputs.append(("bias", rng.standard_normal(n).astype(np.float32)) if with_bias else ("", None))
    consts = {n for n, _ in inputs if n not in ("a",)}
    check("MatMulIntegerToFloat", inputs, [("y", np.float32)], consts=consts, atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("shapes", MM_SHAPES[:3])
def test_matmul_integer16(shapes):
    rng = np.random.default_rng(11)
    inputs = [("a", q(rng, shapes[0], np.int16)), ("b", q(rng, shapes[1], np.int16))]
    check("MatMulInteger16", inputs, [("y", np.int32)])


@pytest.mark.parametrize("dt", INTS)
def test_int8_types_known_only_at_run_time(dt):
    """Contrib ops chained with no value_info: onnx's type inference cannot type the middle
    value, so each kernel takes its dtype from the arrays it is given."""
    from onnx import helper as h

    rng = np.random.default_rng(12)
    x = q(rng, (3, 16), dt)
    params = {"s1": f32(0.05), "z1": zp(dt, 128, 0), "s2": f32(0.02), "z2": zp(dt, 100, -20)}
    params |= {"s3": f32(1 / 256), "z3": zp(dt, 0, -128)}
    nodes = [
        h.make_node("QLinearSigmoid", ["x", "s1", "z1", "s2", "z2"], ["m"], domain=MS),
        h.make_node("QLinearSoftmax", ["m", "s2", "z2", "s3", "z3"], ["y"], domain=MS, opset=13),
    ]
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", elem(dt), x.shape)],
        [h.make_tensor_value_info("y", elem(dt), None)],
        [numpy_helper.from_array(v, k) for k, v in params.items()],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 21), h.make_opsetid(MS, 1)])
    model.ir_version = 10
    got, ref = run_both(model, {"x": x})
    assert got[0].dtype == ref[0].dtype and (got[0] == ref[0]).all()


@pytest.mark.parametrize("dt", [np.uint8, np.int8, np.uint16, np.int16])
@pytest.mark.parametrize("per_axis", [False, True])
def test_contrib_quantize_dequantize_linear(dt, per_axis):
    rng = np.random.default_rng(13)
    x = (rng.standard_normal((2, 3, 4)) * 300).astype(np.float32)
    info = np.iinfo(dt)
    shape = (3,) if per_axis else ()
    scale = rng.uniform(0.01, 2.0, shape).astype(np.float32)
    zero = rng.integers(info.min // 2, info.max // 2 + 1, shape).astype(dt)
    inputs = [("x", x), ("scale", scale), ("zp", zero)]
    check("QuantizeLinear", inputs, [("y", dt)], {"axis": 1}, {"scale", "zp"})
    inputs = [("x", q(rng, (2, 3, 4), dt)), ("scale", scale), ("zp", zero)]
    check("DequantizeLinear", inputs, [("y", np.float32)], {"axis": 1}, {"scale", "zp"}, 1e-6, 1e-6)


@pytest.mark.parametrize("dt", INTS)
@pytest.mark.parametrize(
    "attrs",
    [
        {"kernel_shape": [2, 2], "strides": [2, 2]},
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1},
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 0},
        {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [0, 1, 0, 0]},
        {"kernel_shape": [3], "pads": [1, 1]},
    ],
)
@pytest.mark.parametrize("last", [0, 1])
def test_qlinear_average_pool(dt, attrs, last):
    rng = np.random.default_rng(14)
    nsp = len(attrs["kernel_shape"])
    shape = (2, 3, 7, 6)[: 2 + nsp] if not last else (2, 7, 6)[: 1 + nsp] + (3,)
    inputs = [("x", q(rng, shape, dt)), ("x_scale", f32(0.05)), ("x_zp", zp(dt, 128, 3))]
    inputs += [("y_scale", f32(0.04)), ("y_zp", zp(dt, 120, -3))]
    consts = {"x_scale", "x_zp", "y_scale", "y_zp"}
    check("QLinearAveragePool", inputs, [("y", dt)], {**attrs, "channels_last": last}, consts)


@pytest.mark.parametrize("dt", INTS)
@pytest.mark.parametrize(
    "attrs",
    [{"kernel_shape": [2, 2], "strides": [2, 2]}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}],
)
def test_nhwc_max_pool(dt, attrs):
    rng = np.random.default_rng(15)
    check("NhwcMaxPool", [("x", q(rng, (2, 7, 6, 3), dt))], [("y", dt)], attrs)


@pytest.mark.parametrize("dt,w_dt", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("group", [1, 2])
def test_contrib_qlinear_conv(dt, w_dt, last, per_channel, group):
    rng = np.random.default_rng(16)
    c, m = 4, 6
    x = q(rng, (2, c, 7, 6), dt)
    if last:
        x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    w = q(rng, (m, c // group, 3, 3), w_dt)
    w_zero = 0 if np.dtype(w_dt) == np.int8 else 128
    inputs = [("x", x), ("x_scale", f32(0.02)), ("x_zp", zp(dt, 120, 2)), ("w", w)]
    inputs += [("w_scale", _per(rng, m, per_channel, 0.01, 0.03, np.float32))]
    inputs += [("w_zp", _per(rng, m, per_channel, w_zero, w_zero + 1, w_dt))]
    inputs += [("y_scale", f32(0.3)), ("y_zp", zp(dt, 128, -1))]
    inputs += [("bias", rng.integers(-300, 300, (m,)).astype(np.int32))]
    attrs = {"kernel_shape": [3, 3], "pads": [1, 0, 1, 1], "group": group, "channels_last": last}
    check("QLinearConv", inputs, [("y", dt)], attrs, {n for n, _ in inputs if n != "x"})


@pytest.mark.parametrize("w_dt", [np.uint8, np.int8])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("mask", ["none", "lengths", "2d"])
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_qattention(w_dt, per_column, mask, unidirectional):
    rng = np.random.default_rng(17)
    b, s, h, heads = 2, 5, 8, 2
    w_zero = 128 if np.dtype(w_dt) == np.uint8 else 0
    inputs = [("x", q(rng, (b, s, h), np.uint8)), ("w", q(rng, (h, 3 * h), w_dt))]
    inputs += [("bias", rng.standard_normal(3 * h).astype(np.float32))]
    inputs += [
        ("x_scale", f32(0.02)),
        ("w_scale", _per(rng, 3 * h, per_column, 0.005, 0.02, np.float32)),
    ]
    masks = {
        "none": None,
        "lengths": np.array([5, 3], np.int32),
        "2d": (rng.random((b, s)) > 0.3).astype(np.int32),
    }
    inputs.append(("mask", masks[mask]) if masks[mask] is not None else ("", None))
    inputs += [("x_zp", np.asarray(120, np.uint8))]
    inputs += [("w_zp", _per(rng, 3 * h, per_column, w_zero, w_zero + 1, w_dt))]
    attrs = {"num_heads": heads, "unidirectional": unidirectional}
    consts = {n for n, _ in inputs if n not in ("x", "mask")}
    check("QAttention", inputs, [("y", np.float32)], attrs, consts, atol=1e-5, rtol=1e-4)
