"""Priority, fallback with reasons, disable_fallback, copies and host-side shape math."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper, numpy_helper

import onnxep
from onnxep.errors import FallbackError, NotImplementedOp


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_toy_wins_by_priority_and_rest_falls_back(toy_dist, add_relu_model, rng):
    sess = onnxep.InferenceSession(add_relu_model, providers=["toy", "cpu"])
    rep = sess.placement()
    assert rep["add"].provider == "toy"
    assert rep["relu"].provider == "toy"
    assert rep["softmax"].provider == "cpu"
    assert rep["softmax"].declined[0][0] == "toy"
    assert "Softmax" in rep["softmax"].declined[0][1]
    # feeds go host -> toy, Relu's result toy -> host for Softmax
    pairs = {(c.value, c.src, c.dst) for c in rep.copies}
    assert ("x", "cpu", "toy") in pairs and ("r", "toy", "cpu") in pairs
    assert rep.counts() == {"toy": 2, "cpu": 1}
    x = rng.standard_normal((3, 4)).astype(np.float32)
    y = rng.standard_normal((3, 4)).astype(np.float32)
    (out,) = sess.run(None, {"x": x, "y": y})
    np.testing.assert_allclose(out, _softmax(np.maximum(x + y, 0)), rtol=1e-5, atol=1e-6)
    import onnxep_toy

    assert onnxep_toy.STATS["from_host"] >= 2 and onnxep_toy.STATS["to_host"] >= 1


def test_cpu_first_wins_over_toy(toy_dist, add_relu_model):
    sess = onnxep.InferenceSession(add_relu_model, providers=["cpu", "toy"])
    assert set(sess.placement().counts()) == {"cpu"}


def test_dtype_decline_reason(toy_dist):
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [tensor("x", [2], TensorProto.DOUBLE)],
        [tensor("y", [2], TensorProto.DOUBLE)],
    )
    rep = onnxep.InferenceSession(model, providers=["toy", "cpu"]).placement()
    assert rep["relu"].provider == "cpu"
    assert rep["relu"].declined == (("toy", "Relu: double not supported for input 0"),)


def test_disable_fallback_names_the_node(toy_dist, add_relu_model):
    opts = onnxep.SessionOptions(disable_fallback=True)
    with pytest.raises(FallbackError, match="Softmax.*'softmax'.*toy"):
        onnxep.InferenceSession(add_relu_model, opts, providers=["toy", "cpu"])


def test_nobody_can_run_names_node_op_domain_opset_and_reasons():
    model = make_model(
        [helper.make_node("Frobnicate", ["x"], ["y"], name="frob", domain="com.example")],
        [tensor("x", [2])],
        [tensor("y", [2])],
        extra_opsets=[("com.example", 3)],
    )
    with pytest.raises(NotImplementedOp) as info:
        onnxep.InferenceSession(model, providers=["cpu"])
    msg = str(info.value)
    assert "Frobnicate" in msg and "com.example" in msg and "opset 3" in msg
    assert "'frob'" in msg and "cpu:" in msg


def test_shape_math_feeding_host_inputs_runs_on_host(toy_dist, rng):
    # Reshape's shape comes from Concat(Shape(x)[0:1], [-1]): the toy provider runs
    # Reshape but its shape input must be on the host, so the shape math stays there.
    shape_tail = numpy_helper.from_array(np.array([-1], np.int64), "tail")
    model = make_model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Shape", ["x"], ["s"], name="shape", end=1),
            helper.make_node("Concat", ["s", "tail"], ["target"], name="concat", axis=0),
            helper.make_node("Reshape", ["r", "target"], ["y"], name="reshape"),
        ],
        [tensor("x", ["N", 2, 3])],
        [tensor("y", ["N", 6])],
        inits=[shape_tail],
        opset=17,
    )
    opts = onnxep.SessionOptions(
        graph_optimization_level=onnxep.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    sess = onnxep.InferenceSession(model, opts, providers=["toy", "cpu"])
    rep = sess.placement()
    assert rep["reshape"].provider == "toy"
    assert rep["concat"].provider == "cpu"
    assert rep["concat"].role == "host-shape"
    assert rep["concat"].declined[-1][0] == "toy"
    assert not any(
        c.dst == "cpu" and c.src == "toy" and c.value in ("s", "target") for c in rep.copies
    )
    x = rng.standard_normal((5, 2, 3)).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, np.maximum(x, 0).reshape(5, 6))
