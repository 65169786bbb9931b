"""A layer norm written as primitives (ReduceMean, Sub, Pow or Mul, ReduceMean, Add, Sqrt,
Div, Mul[, Add]) as one LayerNormalization on the CPU provider (``fuse_layer_norm``),
against onnxruntime and the unfused graph; the near-misses it must leave alone; and the
LayerNormalization kernel's compiled rows against float64 and its NumPy path.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import onnxep
from onnxep.providers_cpu.ops import op_layer_normalization

ort = pytest.importorskip("onnxruntime")


def _ln_model(
    shape=(2, 5, 7),
    *,
    opset=12,
    square="pow",
    bias=True,
    swap=False,
    axis=-1,
    keepdims=1,
    two=2.0,
    eps_input=False,
    escape=False,
    scale_shape=None,
    dtype=np.float32,
):
    """``(x - mean) / sqrt(var + eps) * w (+ b)`` over ``axis`` from primitives;
    ``swap``: the other operand order of the scale's Mul and the bias Add; ``eps_input``:
    epsilon fed as a graph input; ``escape``: the deviation is a graph output too."""
    rng = np.random.default_rng(0)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    d = shape[-1]
    inits = [
        numpy_helper.from_array(np.array(two, dtype), "two"),
        numpy_helper.from_array(rng.standard_normal(scale_shape or d).astype(dtype), "w"),
        numpy_helper.from_array(rng.standard_normal(d).astype(dtype), "b"),
    ]
    inputs = [helper.make_tensor_value_info("x", elem, list(shape))]
    if eps_input:
        inputs.append(helper.make_tensor_value_info("eps", elem, []))
    else:
        inits.append(numpy_helper.from_array(np.array(1e-5, dtype), "eps"))

    def mean(src, out):
        if opset >= 18:
            inits.append(numpy_helper.from_array(np.array([axis], np.int64), out + "_axes"))
            return helper.make_node("ReduceMean", [src, out + "_axes"], [out], keepdims=keepdims)
        return helper.make_node("ReduceMean", [src], [out], axes=[axis], keepdims=keepdims)

    nodes = [mean("x", "m"), helper.make_node("Sub", ["x", "m"], ["d"])]
    if square == "pow":
        nodes.append(helper.make_node("Pow", ["d", "two"], ["p"]))
    else:
        nodes.append(helper.make_node("Mul", ["d", "d"], ["p"]))
    nodes += [
        mean("p", "v"),
        helper.make_node("Add", ["v", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["s"]),
        helper.make_node("Div", ["d", "s"], ["n"]),
        helper.make_node("Mul", ["w", "n"] if swap else ["n", "w"], ["nw" if bias else "y"]),
    ]
    if bias:
        nodes.append(helper.make_node("Add", ["b", "nw"] if swap else ["nw", "b"], ["y"]))
    outs = ["y", "d"] if escape else ["y"]
    graph = helper.make_graph(
        nodes, "ln", inputs, [helper.make_tensor_value_info(v, elem, None) for v in outs], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model.SerializeToString()


def _feeds(shape, eps_input=False, dtype=np.float32):
    feed = {"x": (np.random.default_rng(1).standard_normal(shape) * 3 + 1).astype(dtype)}
    if eps_input:
        feed["eps"] = np.array(1e-5, dtype)
    return feed


def _run(model, feed):
    fused = onnxep.InferenceSession(model, providers=["cpu"])
    plain = onnxep.InferenceSession(
        model, onnxep.SessionOptions(disabled_rewrites=["fuse_layer_norm"]), providers=["cpu"]
    )
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feed)
    for sess in (fused, plain):
        for g, w in zip(sess.run(None, feed), want):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    return fused


@pytest.mark.parametrize("opset", [12, 17, 18])
@pytest.mark.parametrize("square", ["pow", "mul"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("swap", [False, True])
def test_layer_norm_fuses_and_matches(compiled, opset, square, bias, swap):
    shape = (2, 5, 7)
    fused = _run(_ln_model(shape, opset=opset, square=square, bias=bias, swap=swap), _feeds(shape))
    ops = [n.op_type for n in fused.placement()]
    assert ops == ["LayerNormalization"]
    assert fused.placement().rewrites["fuse_layer_norm"] == (2 if bias else 1)


@pytest.mark.parametrize("shape", [(1, 1), (3, 1), (4, 120), (2, 3, 33), (0, 8), (2, 0, 5)])
def test_layer_norm_shapes(compiled, shape):
    fused = _run(_ln_model(shape), _feeds(shape))
    assert fused.placement().rewrites["fuse_layer_norm"] == 2


@pytest.mark.parametrize(
    "miss",
    [
        {"axis": 1},  # not the last axis
        {"keepdims": 0},  # the means drop their axis
        {"two": 3.0},  # not a square
        {"eps_input": True},  # epsilon not a constant
        {"escape": True},  # the deviation is read outside
        {"scale_shape": (5, 7)},  # a scale of more than the last axis
    ],
)
def test_near_misses_stay_unfused(miss):
    shape = (2, 5, 7)
    if miss.get("keepdims") == 0:
        # ReduceMean without keepdims does not broadcast against x as a norm: a valid
        # graph needs x's last axis of 1
        shape = (2, 1, 1)
    model = _ln_model(shape, **miss)
    feed = _feeds(shape, miss.get("eps_input", False))
    fused = onnxep.InferenceSession(model, providers=["cpu"])
    assert "LayerNormalization" not in [n.op_type for n in fused.placement()]
    # against the unfused graph, not onnxruntime: onnxruntime 1.32's own fusion takes the
    # cube (``two`` 3) for a layer norm and answers as if it were one
    plain = onnxep.InferenceSession(
        model, onnxep.SessionOptions(disabled_rewrites=["fuse_layer_norm"]), providers=["cpu"]
    )
    for g, w in zip(fused.run(None, feed), plain.run(None, feed)):
        np.testing.assert_array_equal(g, w)


def test_float64_stays_unfused():
    shape = (2, 5, 7)
    model = _ln_model(shape, dtype=np.float64)
    fused = _run(model, _feeds(shape, dtype=np.float64))
    assert "LayerNormalization" not in [n.op_type for n in fused.placement()]


class _Node:
    def __init__(self, **attrs):
        self.attrs = attrs
        self.op_type = "LayerNormalization"

    def attr(self, name, default=None):
        return self.attrs.get(name, default)

    def has_output(self, i):
        return i == 0


def _float64_ln(x, w, b, eps):
    x = x.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):  # the means of empty rows
        c = x - x.mean(-1, keepdims=True)
        y = c / np.sqrt((c * c).mean(-1, keepdims=True) + eps) * w
    return y if b is None else y + b


@pytest.mark.parametrize("shape", [(1, 1), (5, 3), (7, 120), (2, 3, 257), (4, 0), (0, 6)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_kernel_rows_against_float64(compiled, shape, with_bias):
    rng = np.random.default_rng(shape[-1])
    x = (rng.standard_normal(shape) * 4 + 2).astype(np.float32)
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    b = rng.standard_normal(shape[-1]).astype(np.float32) if with_bias else None
    run = op_layer_normalization.layer_normalization(_Node(epsilon=1e-5), np)
    (y,) = run(x, w, b) if with_bias else run(x, w)
    assert y.shape == x.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, _float64_ln(x, w, b, 1e-5), rtol=2e-5, atol=2e-5)


def test_kernel_strided_input_and_nan(compiled):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 20)).astype(np.float32)[::2, ::2]  # strided
    w = np.ones(10, np.float32)
    run = op_layer_normalization.layer_normalization(_Node(epsilon=1e-5), np)
    (y,) = run(x, w, None)
    np.testing.assert_allclose(y, _float64_ln(x, w, None, 1e-5), rtol=2e-5, atol=2e-5)
    x = np.ascontiguousarray(x)
    x[1, 3] = np.nan
    (y,) = run(x, w, None)
    assert np.isnan(y[1]).all() and not np.isnan(y[[0, 2]]).any()
