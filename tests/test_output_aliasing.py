"""No output shares memory with a feed, a constant, or a buffer the session keeps for later runs."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper, numpy_helper

import onnxep
from onnxep.execute.aliasing import FEED, KEPT, OutputRule

I64 = np.int64
LEVELS = [
    onnxep.GraphOptimizationLevel.ORT_DISABLE_ALL,
    onnxep.GraphOptimizationLevel.ORT_ENABLE_ALL,
]


def _session(model, level=onnxep.GraphOptimizationLevel.ORT_ENABLE_ALL):
    so = onnxep.SessionOptions()
    so.graph_optimization_level = level
    return onnxep.InferenceSession(model, so, providers=["cpu"])


def _const(name, values):
    return numpy_helper.from_array(np.asarray(values), name)


def _one_node(op, extra_inputs=(), inits=(), outs=("y",), opset=18, **attrs):
    """x (2, 3, 4) float -> op -> outs; extra inputs are initializers."""
    node = helper.make_node(op, ["x", *extra_inputs], list(outs), **attrs)
    return make_model(
        [node], [tensor("x", [2, 3, 4])], [tensor(o, None) for o in outs], inits, opset=opset
    )


# Every op whose CPU kernel returns its input or a view of it (found by running the ONNX
# node suite with the guard off), plus the shape ops that could: each must hand out
# an array of its own.
VIEW_OPS = {
    "Identity": _one_node("Identity"),
    "Reshape": _one_node("Reshape", ["shape"], [_const("shape", [6, 4])]),
    "Squeeze": make_model(
        [helper.make_node("Squeeze", ["x", "axes"], ["y"])],
        [tensor("x", [2, 1, 4])],
        [tensor("y", None)],
        [_const("axes", [1])],
    ),
    "Unsqueeze": _one_node("Unsqueeze", ["axes"], [_const("axes", [0])]),
    "Flatten": _one_node("Flatten", axis=1),
    "Transpose": _one_node("Transpose", perm=[2, 0, 1]),
    "Slice": _one_node(
        "Slice", ["starts", "ends"], [_const("starts", [0, 1]), _const("ends", [2, 3])]
    ),
    "Expand": _one_node("Expand", ["shape"], [_const("shape", [2, 3, 4])]),
    "Split": _one_node("Split", outs=("a", "b"), axis=2, num_outputs=2),
    "Dropout": _one_node("Dropout"),
    "Clip": _one_node("Clip"),
    "Max": _one_node("Max"),
    "Sum": _one_node("Sum"),
    "ReduceSum": _one_node(
        "ReduceSum", ["axes"], [_const("axes", np.zeros(0, I64))], noop_with_empty_axes=1
    ),
    "Einsum": _one_node("Einsum", equation="abc->cab"),
    "CastLike": _one_node("CastLike", ["like"], [_const("like", np.zeros(1, np.float32))]),
    "Cast": _one_node("Cast", to=TensorProto.FLOAT),
    "BitCast": make_model(
        [helper.make_node("BitCast", ["x"], ["y"], to=TensorProto.FLOAT)],
        [tensor("x", [2, 3, 4])],
        [tensor("y", None)],
        opset=26,
    ),
}


def _feed(model):
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return np.arange(np.prod(shape), dtype=np.float32).reshape(shape) - 5


def _check_outputs_are_owned(sess, x, runs=3):
    """Each run's outputs: not the feed, no memory shared with it, and writing into them
    changes neither the feed nor a later run's result."""
    keep = x.copy()
    want = None
    for _ in range(runs):  # the checked first run, then the generated function
        outs = sess.run(None, {"x": x})
        got = [o.copy() for o in outs]
        if want is None:
            want = got
        for o, w in zip(got, want):
            np.testing.assert_array_equal(o, w)
        for o in outs:
            assert o is not x
            assert not np.shares_memory(o, x)
            assert o.flags.writeable
            o[...] = 77
        np.testing.assert_array_equal(x, keep)


@pytest.mark.parametrize("level", LEVELS, ids=["disable_all", "enable_all"])
@pytest.mark.parametrize("op", sorted(VIEW_OPS))
def test_view_producing_ops_hand_out_their_own_arrays(op, level):
    model = VIEW_OPS[op]
    _check_outputs_are_owned(_session(model, level), _feed(model))


def test_outputs_that_are_views_of_the_feed_through_a_chain():
    # Reshape(Shape-derived shape) -> Transpose -> Slice: the shape is cached per input shape.
    model = make_model(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Reshape", ["x", "s"], ["r"]),
            helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0, 2]),
            helper.make_node("Slice", ["t", "st", "en"], ["y"]),
            helper.make_node("Squeeze", ["y", "ax"], ["z"]),
        ],
        [tensor("x", ["N", 3, 4])],
        [tensor("y", None), tensor("z", None)],
        [_const("st", [0]), _const("en", [1]), _const("ax", [0])],
    )
    sess = _session(model)
    _check_outputs_are_owned(sess, np.arange(24, dtype=np.float32).reshape(2, 3, 4))


def test_a_cached_shape_value_handed_out_is_a_copy():
    # Identity(Shape(x)) as an output: Shape's value lives in the shape cache.
    model = make_model(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("Identity", ["s"], ["y"]),
            helper.make_node("Relu", ["x"], ["r"]),
        ],
        [tensor("x", ["N", 4])],
        [tensor("y", None, TensorProto.INT64), tensor("r", None)],
    )
    sess = _session(model, onnxep.GraphOptimizationLevel.ORT_DISABLE_ALL)
    x = np.ones((2, 4), np.float32)
    for _ in range(3):
        y, _ = sess.run(None, {"x": x})
        assert y.tolist() == [2, 4]
        y[...] = -1


@pytest.mark.parametrize("level", LEVELS, ids=["disable_all", "enable_all"])
def test_initializer_outputs_and_their_views_are_writable_copies(level):
    w = np.arange(6, dtype=np.float32)
    model = make_model(
        [
            helper.make_node("Reshape", ["w", "shape"], ["wr"]),
            helper.make_node("Relu", ["x"], ["y"]),
            helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(w, "k")),
        ],
        [tensor("x", [3])],
        [tensor("w", None), tensor("wr", None), tensor("y", None), tensor("k", None)],
        [numpy_helper.from_array(w, "w"), _const("shape", [2, 3])],
    )
    sess = _session(model, level)
    for _ in range(3):
        w_out, wr, _, k = sess.run(None, {"x": np.ones(3, np.float32)})
        np.testing.assert_array_equal(w_out, w)
        np.testing.assert_array_equal(wr, w.reshape(2, 3))
        np.testing.assert_array_equal(k, w)
        for o in (w_out, wr, k):
            assert o.flags.writeable
            o[...] = -9  # must not reach the next run
        assert not np.shares_memory(w_out, wr)


def test_an_input_listed_as_output_and_a_value_listed_twice_are_distinct_arrays():
    model = make_model(
        [helper.make_node("Relu", ["x"], ["r"])],
        [tensor("x", [3])],
        [tensor("x", [3]), tensor("r", [3]), tensor("r", [3])],
    )
    sess = _session(model)
    x = np.array([-1, 0, 1], np.float32)
    for _ in range(3):
        x_out, r1, r2 = sess.run(None, {"x": x})
        assert x_out is not x and not np.shares_memory(x_out, x)
        assert r1 is not r2 and not np.shares_memory(r1, r2)
        np.testing.assert_array_equal(r1, r2)


def test_a_subgraph_returning_the_outer_feed_does_not_alias_it():
    then = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["t"])], "then", [], [tensor("t", [3])]
    )
    other = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["n"])], "else", [], [tensor("n", [3])]
    )
    model = make_model(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
        [tensor("c", [], TensorProto.BOOL), tensor("x", [3])],
        [tensor("y", [3])],
    )
    sess = _session(model)
    x = np.array([1, 2, 3], np.float32)
    for _ in range(3):
        (y,) = sess.run(None, {"c": np.array(True), "x": x})
        assert not np.shares_memory(y, x)
        y[...] = 0
    np.testing.assert_array_equal(x, [1, 2, 3])


def test_outputs_on_the_device_path_do_not_alias_feeds_either():
    model = VIEW_OPS["Reshape"]
    sess = _session(model)
    x = _feed(model)
    for _ in range(3):
        (y,) = sess.compiled.run({"x": x}, on_device=True)
        assert not np.shares_memory(y, x)


@pytest.mark.parametrize(
    "kernel_shape,pads,group,strides",
    [
        ([3, 3], [1, 1, 1, 1], 1, [1, 1]),  # padded, im2col with a tuned layout
        ([1, 1], [0, 0, 0, 0], 1, [1, 1]),  # pointwise: no im2col
        ([3, 3], [1, 1, 1, 1], 4, [1, 1]),  # depthwise
        ([3, 3], [0, 0, 0, 0], 1, [2, 2]),  # strided
    ],
)
def test_conv_never_hands_out_its_scratch(kernel_shape, pads, group, strides):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 4 // group, *kernel_shape)).astype(np.float32)
    model = make_model(
        [
            helper.make_node(
                "Conv",
                ["x", "w", "b"],
                ["y"],
                kernel_shape=kernel_shape,
                pads=pads,
                group=group,
                strides=strides,
            )
        ],
        [tensor("x", [1, 4, 12, 12])],
        [tensor("y", None)],
        [numpy_helper.from_array(w, "w"), _const("b", np.ones(4, np.float32))],
    )
    sess = _session(model)
    a, b = (rng.standard_normal((1, 4, 12, 12)).astype(np.float32) for _ in range(2))
    for _ in range(2):
        ya = sess.run(None, {"x": a})[0]
        want = ya.copy()
        yb = sess.run(None, {"x": b})[0]  # a later run must not write into ya
        np.testing.assert_array_equal(ya, want)
        assert not np.shares_memory(ya, yb)


def test_plan_time_rules():
    # Decided once per plan: a feed output is always copied; a kernel's output that may be
    # a view of a feed is checked per run against the feeds; one computed from shapes
    # alone (host inputs) is handed out as it is; one from a kernel without inputs is
    # checked against what that kernel returned.
    model = make_model(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("ConstantOfShape", ["s"], ["z"]),
            helper.make_node("RandomNormal", [], ["n"], shape=[2]),
        ],
        [tensor("x", [3])],
        [tensor("x", [3]), tensor("r", [3]), tensor("z", [3]), tensor("n", [2])],
    )
    sess = _session(model, onnxep.GraphOptimizationLevel.ORT_DISABLE_ALL)
    x_rule, r_rule, z_rule, n_rule = sess.compiled.executor.rules
    assert x_rule.copy
    assert r_rule == OutputRule(r_rule.slot, check=FEED)
    assert z_rule == OutputRule(z_rule.slot)
    assert n_rule == OutputRule(n_rule.slot, check=KEPT)
    x = np.ones(3, np.float32)
    for _ in range(3):
        outs = sess.run(None, {"x": x})
        assert [o.shape for o in outs] == [(3,), (3,), (3,), (2,)]
