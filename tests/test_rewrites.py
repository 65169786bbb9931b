"""Basic rewrites: constant folding, identity and dead-node removal, switches and counters."""

from __future__ import annotations

import numpy as np
from conftest import make_model, tensor
from onnx import TensorProto, helper, numpy_helper

import onnxep


def _model():
    c = numpy_helper.from_array(np.array([1.0, 2.0, 3.0], np.float32), "c")
    return make_model(
        [
            helper.make_node("Add", ["c", "c"], ["c2"], name="fold_me"),
            helper.make_node("Identity", ["x"], ["xi"], name="ident"),
            helper.make_node("Mul", ["xi", "c2"], ["y"], name="mul"),
            helper.make_node("Relu", ["x"], ["unused"], name="dead"),
            helper.make_node("Shape", ["x"], ["shp"], name="shape"),
            helper.make_node("Reshape", ["y", "shp"], ["out"], name="reshape"),
        ],
        [tensor("x", [3])],
        [tensor("out", [3])],
        inits=[c],
    )


def test_basic_rewrites_fire_and_are_counted():
    sess = onnxep.InferenceSession(_model(), providers=["cpu"])
    rep = sess.placement()
    names = {n.node for n in rep}
    assert names == {"mul", "reshape"}
    assert rep.rewrites["fold_constants"] == 2  # Add of constants, Shape of a static shape
    assert rep.rewrites["eliminate_identity"] == 1
    assert rep.rewrites["remove_dead_nodes"] == 1
    x = np.array([1.0, -1.0, 2.0], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x * [2.0, 4.0, 6.0])


def test_rewrites_can_be_switched_off():
    opts = onnxep.SessionOptions(disabled_rewrites=["fold_constants"])
    sess = onnxep.InferenceSession(_model(), opts, providers=["cpu"])
    rep = sess.placement()
    assert "fold_me" in {n.node for n in rep}
    assert rep.skipped_rewrites == ["fold_constants"]
    x = np.array([1.0, -1.0, 2.0], np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x * [2.0, 4.0, 6.0])


def test_disable_all_keeps_every_node():
    opts = onnxep.SessionOptions(
        graph_optimization_level=onnxep.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    sess = onnxep.InferenceSession(_model(), opts, providers=["cpu"])
    assert len(sess.placement()) == 6
    assert sess.placement().rewrites == {}


def test_identity_on_graph_output_is_kept():
    m = make_model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [tensor("x", [2], TensorProto.INT64)],
        [tensor("y", [2], TensorProto.INT64)],
    )
    sess = onnxep.InferenceSession(m, providers=["cpu"])
    np.testing.assert_array_equal(sess.run(None, {"x": np.array([4, 5])})[0], [4, 5])


def test_large_transpose_of_a_weight_folds_contiguous():
    # Tied embeddings: Gather(Transpose(lm_head weight)). The transpose is as large as
    # the weight (past the folding cap) yet must fold, and into a contiguous table.
    w = np.arange(2100 * 2000, dtype=np.float32).reshape(2100, 2000)
    m = make_model(
        [
            helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0], name="t"),
            helper.make_node("Gather", ["wt", "ids"], ["y"], axis=0, name="g"),
        ],
        [tensor("ids", [2], TensorProto.INT64)],
        [tensor("y", [2, 2100])],
        inits=[numpy_helper.from_array(w, "w")],
    )
    sess = onnxep.InferenceSession(m, providers=["cpu"])
    assert [n.node for n in sess.placement()] == ["g"]
    plan = sess.compiled.plan
    tables = [v for v in plan.template if isinstance(v, np.ndarray) and v.size == w.size]
    assert tables and all(t.flags.c_contiguous for t in tables)
    (y,) = sess.run(None, {"ids": np.array([3, 1999])})
    np.testing.assert_array_equal(y, w.T[[3, 1999]])
