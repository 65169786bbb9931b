"""What a small node costs above its NumPy call (docs/cpu_kernels.md, planexec): the plan's
constants carry NumPy's own descriptors, a typed float Div and a small per-channel Add
are the ufunc itself (so run in place), Reshape and Relu give the bits they gave."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxep
from onnxep.compile.nodeinfo import const_of

ort = pytest.importorskip("onnxruntime")

_UNFUSED = onnxep.SessionOptions(disabled_rewrites=["fuse_elementwise_chains"])


def _one_op(op, shape, const, dtype=TensorProto.FLOAT, **attrs):
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "k"] if const is not None else ["x"], ["y"], **attrs)],
        "g",
        [helper.make_tensor_value_info("x", dtype, shape)],
        [helper.make_tensor_value_info("y", dtype, None)],
        [] if const is None else [numpy_helper.from_array(const, "k")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _ort(model):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize(
    "dtype", [np.float32, np.float64, np.float16, np.int64, np.int32, np.uint8, np.bool_]
)
def test_constants_carry_numpys_own_descriptor(dtype):
    arr = (np.arange(6) % 3).astype(dtype).reshape(2, 3)
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        [helper.make_node("Identity", ["k"], ["y"])],
        "g",
        [],
        [helper.make_tensor_value_info("y", t, None)],
        [numpy_helper.from_array(arr, "k")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    const = next(c for c in sess.compiled.plan.template if isinstance(c, np.ndarray))
    assert const.dtype is np.dtype(dtype)
    np.testing.assert_array_equal(const, arr)
    np.testing.assert_array_equal(sess.run(None, {})[0], arr)


def test_const_of_leaves_other_dtypes_alone():
    import onnx_ir as ir

    arr = np.array(["a", "bc"], dtype=object)
    got = const_of(ir.Value(name="v", const_value=ir.tensor(arr)))
    np.testing.assert_array_equal(got, arr)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_typed_float_div_is_the_ufunc_and_runs_in_place(dtype):
    t = TensorProto.FLOAT if dtype is np.float32 else TensorProto.DOUBLE
    c = np.array([2.0, 0.0, -0.0, np.inf], dtype)
    nodes = [
        helper.make_node("Div", ["x", "k"], ["a"]),
        helper.make_node("Div", ["a", "k"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", t, [3, 4])],
        [helper.make_tensor_value_info("y", t, [3, 4])],
        [numpy_helper.from_array(c, "k")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    sess = onnxep.InferenceSession(model, _UNFUSED, providers=["cpu"])
    assert [s.direct for s in sess.compiled.plan.steps] == [np.divide, np.divide]
    assert sess.placement().in_place_steps == 1
    x = np.array([[1, -1, 0, np.nan], [3, 5, -7, 1e-30], [np.inf, 2, 2, -2]], dtype)
    with np.errstate(all="ignore"):
        want = _ort(model).run(None, {"x": x})[0]
        for _ in range(3):
            np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want)


def test_untyped_and_integer_div_keep_their_kernels():
    c = np.array([2, -3, 4], np.int32)
    model = _one_op("Div", [3], c, TensorProto.INT32)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    assert sess.compiled.plan.steps[0].direct is not np.divide
    x = np.array([7, 7, -7], np.int32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], _ort(model).run(None, {"x": x})[0])


def test_a_small_per_channel_map_is_the_ufunc():
    # [1, 8, 4, 4] * [1, 8, 1, 1]: under the compiled pass's size, so the generic kernel,
    # whose ufunc the plan calls with the constant broadcast once (broadcast_consts)
    rng = np.random.default_rng(1)
    c = rng.standard_normal((1, 8, 1, 1)).astype(np.float32)
    model = _one_op("Mul", [1, 8, 4, 4], c)
    sess = onnxep.InferenceSession(model, _UNFUSED, providers=["cpu"])
    assert sess.compiled.plan.steps[0].direct is np.multiply
    x = rng.standard_normal((1, 8, 4, 4)).astype(np.float32)
    want = _ort(model).run(None, {"x": x})[0]
    for _ in range(3):
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want)


@pytest.mark.parametrize(
    "shape,target,allowzero",
    [
        ([2, 3, 4], [0, -1], 0),
        ([2, 3, 4], [4, 0, 2, 3], 1),
        ([6], [2, -1, 1], 0),
        ([0, 3], [3, 0], 1),
    ],
)
def test_reshape_with_a_constant_shape(shape, target, allowzero):
    model = _one_op("Reshape", shape, np.array(target, np.int64), allowzero=allowzero)
    if allowzero and 0 in target and 0 not in shape:
        # allowzero keeps a literal 0: only valid where the input is empty
        model = _one_op("Reshape", [0, *shape[1:]], np.array(target, np.int64), allowzero=1)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.arange(int(np.prod(dims)), dtype=np.float32).reshape(dims)
    want = _ort(model).run(None, {"x": x})[0]
    for _ in range(2):
        got = sess.run(None, {"x": x})[0]
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_reshape_to_a_wrong_size_names_the_node():
    model = _one_op("Reshape", ["n"], np.array([3], np.int64))
    model.graph.node[0].name = "flat"
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    with pytest.raises(onnxep.errors.RunError, match="Reshape node 'flat'.*reshape"):
        sess.run(None, {"x": np.ones(4, np.float32)})


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_small_relu_bits(dtype):
    t = TensorProto.FLOAT if dtype is np.float32 else TensorProto.DOUBLE
    model = _one_op("Relu", [9], None, t)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    x = np.array([-0.0, 0.0, -1, 1, np.nan, -np.inf, np.inf, 1e-45, -1e-45], dtype)
    # the kernel's bits (an input -0 gives +0, as its large path does), and onnxruntime's
    # values (which keep -0: equal as numbers)
    bits = np.maximum(x, dtype(0))
    np.testing.assert_array_equal(_ort(model).run(None, {"x": x})[0], bits)
    for _ in range(2):
        got = sess.run(None, {"x": x})[0]
        assert got.dtype == dtype
        np.testing.assert_array_equal(got.view(np.uint8), bits.view(np.uint8))


def test_the_last_feed_that_passed_does_not_let_others_through():
    model = _one_op("Relu", [2, 3], None)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    x = np.ones((2, 3), np.float32)
    for _ in range(2):
        sess.run(None, {"x": x})
    # an equal dtype of another object passes through the full check, as before
    same = x.view(np.dtype(np.float32).newbyteorder("<"))
    np.testing.assert_array_equal(sess.run(None, {"x": same})[0], x)
    sess.run(None, {"x": x})
    for bad, what in [
        (x.astype(np.float64), "dtype float64"),
        (x.astype(np.float32).view(np.dtype(">f4")).copy(), "dtype >f4"),
        (np.ones((3, 3), np.float32), "at dim 0"),
        (np.ones((2, 3, 1), np.float32), "rank 3"),
    ]:
        with pytest.raises(onnxep.errors.InvalidArgument, match=what):
            sess.run(None, {"x": bad})
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x)
