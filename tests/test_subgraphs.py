"""If, Loop and Scan run through the same machinery, with outer-scope values at any depth."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper

import onnxep


def _if_model():
    then = helper.make_graph(
        [helper.make_node("Add", ["x", "y"], ["t"])], "then", [], [tensor("t", [2])]
    )
    other = helper.make_graph(
        [helper.make_node("Sub", ["x", "y"], ["e"])], "else", [], [tensor("e", [2])]
    )
    return make_model(
        [helper.make_node("If", ["c"], ["o"], name="if", then_branch=then, else_branch=other)],
        [tensor("c", [], TensorProto.BOOL), tensor("x", [2]), tensor("y", [2])],
        [tensor("o", [2])],
    )


def test_if_reads_outer_scope():
    sess = onnxep.InferenceSession(_if_model(), providers=["cpu"])
    x, y = np.array([1, 2], np.float32), np.array([10, 20], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"c": np.array(True), "x": x, "y": y})[0], x + y)
    np.testing.assert_array_equal(sess.run(None, {"c": np.array(False), "x": x, "y": y})[0], x - y)
    names = {n.node for n in sess.placement()}
    assert any(n.startswith("then/") for n in names) and any(n.startswith("else/") for n in names)


def test_loop_with_nested_if_reads_outer_outer_scope():
    # Loop body: acc = acc + (if i is even: w else: -w), where w lives two scopes up.
    even_then = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["a"])], "t", [], [tensor("a", [2])]
    )
    even_else = helper.make_graph(
        [helper.make_node("Neg", ["w"], ["b"])], "e", [], [tensor("b", [2])]
    )
    two = helper.make_tensor("two", TensorProto.INT64, [], [2])
    zero = helper.make_tensor("zero", TensorProto.INT64, [], [0])
    body = helper.make_graph(
        [
            helper.make_node("Mod", ["i", "two"], ["r"]),
            helper.make_node("Equal", ["r", "zero"], ["even"]),
            helper.make_node(
                "If", ["even"], ["step"], then_branch=even_then, else_branch=even_else
            ),
            helper.make_node("Add", ["acc", "step"], ["acc_out"]),
            helper.make_node("Identity", ["cond"], ["cond_out"]),
        ],
        "body",
        [
            tensor("i", [], TensorProto.INT64),
            tensor("cond", [], TensorProto.BOOL),
            tensor("acc", [2]),
        ],
        [tensor("cond_out", [], TensorProto.BOOL), tensor("acc_out", [2])],
        [two, zero],
    )
    m = make_model(
        [helper.make_node("Loop", ["n", "", "acc0"], ["acc"], body=body)],
        [tensor("n", [], TensorProto.INT64), tensor("acc0", [2]), tensor("w", [2])],
        [tensor("acc", [2])],
    )
    sess = onnxep.InferenceSession(m, providers=["cpu"])
    w = np.array([1.0, 3.0], np.float32)
    for n in (0, 1, 4, 5):
        (acc,) = sess.run(None, {"n": np.array(n), "acc0": np.zeros(2, np.float32), "w": w})
        np.testing.assert_array_equal(acc, w * (n % 2))


@pytest.mark.parametrize("threads", [1, 4])
def test_subgraph_sessions_are_thread_safe(threads):
    from concurrent.futures import ThreadPoolExecutor

    sess = onnxep.InferenceSession(_if_model(), providers=["cpu"])
    rng = np.random.default_rng(0)
    cases = [
        (
            np.array(bool(i % 2)),
            rng.standard_normal(2).astype(np.float32),
            rng.standard_normal(2).astype(np.float32),
        )
        for i in range(32)
    ]
    with ThreadPoolExecutor(threads) as pool:
        outs = list(pool.map(lambda c: sess.run(None, {"c": c[0], "x": c[1], "y": c[2]})[0], cases))
    for (c, x, y), o in zip(cases, outs):
        np.testing.assert_array_equal(o, x + y if c else x - y)
