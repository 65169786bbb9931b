"""Shapes made static after folding (rewrites/static_shapes.py) and If nodes on a constant
condition inlined (rewrites/inline_if.py): the graph loses its shape tests, the values stay."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxep
from onnxep.providers.fusions.naming import graphs

ort = pytest.importorskip("onnxruntime")
OFF = onnxep.SessionOptions(disabled_rewrites=["inline_constant_if", "infer_static_shapes"])
F = TensorProto.FLOAT


def _ops(sess) -> list[str]:
    return [n.op_type for g in graphs(sess.compiled.model.graph) for n in g]


def _check(model, feeds, with_ort=True):
    """onnxep with and without the passes, and onnxruntime: the same values."""
    data = model.SerializeToString()
    on = onnxep.InferenceSession(data, providers=["cpu"])
    off = onnxep.InferenceSession(data, OFF, providers=["cpu"])
    want = [None] * len(model.graph.output)
    if with_ort:
        so = ort.SessionOptions()
        so.log_severity_level = 3
        theirs = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
        want = theirs.run(None, feeds)
    for _ in range(2):  # the checked first run, then the generated plan
        for a, b, w in zip(on.run(None, feeds), off.run(None, feeds), want):
            np.testing.assert_array_equal(a, b)
            if with_ort:
                np.testing.assert_allclose(a, w, rtol=1e-6, atol=1e-7)
    return on, off


def _branch(name, nodes, out, inits=()):
    return helper.make_graph(
        nodes, name, [], [helper.make_tensor_value_info(out, F, None)], list(inits)
    )


def _squeeze_guard(x_dims):
    """torch's guarded squeeze: pads computed through a Transpose (which onnx's data
    propagation at load does not follow), then If(Shape(p)[0] == 1, Squeeze(p, 0), p)."""
    nodes = [
        helper.make_node("Transpose", ["praw"], ["pt"], perm=[1, 0]),
        helper.make_node("Reshape", ["pt", "flat"], ["pads"]),
        helper.make_node("Pad", ["x", "pads"], ["p"], mode="reflect"),
        helper.make_node("Shape", ["p"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["d0"]),  # a scalar index: a 0-d result
        helper.make_node("Equal", ["d0", "one"], ["cond"]),
        helper.make_node(
            "If",
            ["cond"],
            ["q"],
            then_branch=_branch("th", [helper.make_node("Squeeze", ["p", "ax"], ["sq"])], "sq"),
            else_branch=_branch("el", [helper.make_node("Neg", ["p"], ["ng"])], "ng"),
        ),
        helper.make_node("Mul", ["q", "two"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array([[0, 0], [2, 3]], np.int64), "praw"),
        numpy_helper.from_array(np.array([-1], np.int64), "flat"),
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array([0], np.int64), "ax"),
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F, x_dims)],
        [helper.make_tensor_value_info("y", F, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("rows", [1, 3])
def test_static_shape_test_folds_and_its_if_is_inlined(rows):
    model = _squeeze_guard([rows, 6])
    x = np.arange(rows * 6, dtype=np.float32).reshape(rows, 6)
    on, off = _check(model, {"x": x})
    assert "If" in _ops(off) and "Shape" in _ops(off)
    ops = _ops(on)
    assert "If" not in ops and "Shape" not in ops and "Equal" not in ops
    assert ops.count("Squeeze" if rows == 1 else "Neg") == 1
    assert on.placement().rewrites["inline_constant_if"] == 1


def test_dynamic_dims_keep_the_if():
    model = _squeeze_guard(["n", 6])
    on = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    assert "If" in _ops(on)
    for rows in (1, 2):
        x = np.ones((rows, 6), np.float32)
        _check(model, {"x": x})


def _if_model(cond, then_nodes, then_out, else_nodes, else_out, then_inits=(), outer=()):
    nodes = [
        helper.make_node(
            "If",
            ["c"],
            ["y"],
            then_branch=_branch("th", then_nodes, then_out, then_inits),
            else_branch=_branch("el", else_nodes, else_out),
        ),
    ]
    inits = [numpy_helper.from_array(np.array(cond), "c"), *outer]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F, [3])],
        [helper.make_tensor_value_info("y", F, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("cond", [True, False])
def test_constant_condition_with_branch_initializer_named_like_an_outer_one(cond):
    # the then branch's initializer "w" has the outer graph's name: moved out, it is renamed,
    # and each reader keeps its own (onnxruntime reads the outer "w" in the branch too, where
    # onnxep, with or without the pass, reads the branch's: ONNX wants distinct names)
    then_w = numpy_helper.from_array(np.array([1.0, 2.0, 3.0], np.float32), "w")
    outer_w = numpy_helper.from_array(np.array([5.0, 5.0, 5.0], np.float32), "w")
    model = _if_model(
        cond,
        [helper.make_node("Add", ["x", "w"], ["t"])],
        "t",
        [helper.make_node("Sub", ["x", "w"], ["e"])],  # reads the outer w
        "e",
        then_inits=[then_w],
        outer=[outer_w],
    )
    on, _ = _check(model, {"x": np.array([1.0, 1.0, 1.0], np.float32)}, with_ort=not cond)
    assert "If" not in _ops(on)


def test_one_value_given_twice_becomes_two_outputs():
    branch = _branch("th", [helper.make_node("Neg", ["x"], ["t"])], "t")
    branch.output.append(helper.make_tensor_value_info("t", F, None))
    other = _branch("el", [helper.make_node("Abs", ["x"], ["e"])], "e")
    other.output.append(helper.make_tensor_value_info("e", F, None))
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["y", "z"], then_branch=branch, else_branch=other)],
        "g",
        [helper.make_tensor_value_info("x", F, [3])],
        [helper.make_tensor_value_info("y", F, None), helper.make_tensor_value_info("z", F, None)],
        [numpy_helper.from_array(np.array(True), "c")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    # onnxruntime refuses a branch that gives one value twice
    on, _ = _check(model, {"x": np.array([1.0, -2.0, 3.0], np.float32)}, with_ort=False)
    assert "If" not in _ops(on)
    y, z = on.run(None, {"x": np.array([1.0, -2.0, 3.0], np.float32)})
    np.testing.assert_array_equal(y, z)


def test_two_ifs_whose_branches_share_names():
    def guarded(inp, out, cond_name):
        return helper.make_node(
            "If",
            [cond_name],
            [out],
            then_branch=_branch("th", [helper.make_node("Neg", [inp], ["r"])], "r"),
            else_branch=_branch("el", [helper.make_node("Abs", [inp], ["r"])], "r"),
        )

    graph = helper.make_graph(
        [guarded("x", "a", "c1"), guarded("a", "y", "c2")],
        "g",
        [helper.make_tensor_value_info("x", F, [3])],
        [helper.make_tensor_value_info("y", F, None)],
        [
            numpy_helper.from_array(np.array(True), "c1"),
            numpy_helper.from_array(np.array(False), "c2"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    on, _ = _check(model, {"x": np.array([1.0, -2.0, 3.0], np.float32)})
    assert _ops(on) == ["Neg", "Abs"]


def test_condition_a_feed_may_override_is_not_inlined():
    model = _if_model(
        True,
        [helper.make_node("Neg", ["x"], ["t"])],
        "t",
        [helper.make_node("Abs", ["x"], ["e"])],
        "e",
    )
    model.graph.input.append(helper.make_tensor_value_info("c", TensorProto.BOOL, []))
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    assert "If" in _ops(sess)
    x = np.array([1.0, -2.0, 3.0], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], -x)
    np.testing.assert_array_equal(sess.run(None, {"x": x, "c": np.array(False)})[0], np.abs(x))
