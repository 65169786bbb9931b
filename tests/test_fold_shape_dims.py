"""FoldConstants' Gather of a Shape's static dims (``fold_constants._shape_dims``): torch's
``chunk`` of a [batch, 3H] tensor computes its Slice bounds from ``Shape(y)[1]``; where the
picked dims are static the Gather folds (and the arithmetic after it), where one is free it
stays; results against onnxruntime and the fold switched off."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper, numpy_helper

import onnxep
import onnxep.rewrites.fold_constants as fc

H = helper.make_node


def _chunk_model(index, start=None, opset=17):
    """y = x[:, :d] + x[:, d:2d], d = Shape(x)[index] // 3, x [batch, 6] (batch free)."""
    shape_attrs = {} if start is None else {"start": start}
    nodes = [
        H("Shape", ["x"], ["s"], **shape_attrs),
        H("Gather", ["s", "i"], ["n"], axis=0),
        H("Div", ["n", "three"], ["d"]),
        H("Mul", ["d", "two"], ["d2"]),
        H("Slice", ["x", "zero", "d", "one"], ["a"]),
        H("Slice", ["x", "d", "d2", "one"], ["b"]),
        H("Add", ["a", "b"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(index, np.int64), "i"),
        numpy_helper.from_array(np.array([3], np.int64), "three"),
        numpy_helper.from_array(np.array([2], np.int64), "two"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
    ]
    m = make_model(nodes, [tensor("x", ["batch", 6])], [tensor("y", None)], inits, opset=opset)
    return m.SerializeToString()


def _ops(model, fold=True, monkeypatch=None):
    if monkeypatch is not None:
        monkeypatch.setattr(fc, "SHAPE_DIMS", fold)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    return sess, [n.op_type for n in sess.placement().nodes]


def _check(sess, model, batch=4):
    x = np.arange(batch * 6, dtype=np.float32).reshape(batch, 6)
    got = sess.run(None, {"x": x})[0]
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, x[:, :2] + x[:, 2:4])


@pytest.mark.parametrize("index", [[1], 1, -1, [-1]], ids=["1-d", "0-d", "negative", "neg-1-d"])
def test_static_dim_folds(index, monkeypatch):
    model = _chunk_model(index)
    sess, ops = _ops(model, True, monkeypatch)
    assert ops == ["Slice", "Slice", "Add"], ops
    _check(sess, model)
    _check(sess, model, batch=1)
    plain, plain_ops = _ops(model, False, monkeypatch)
    assert "Shape" in plain_ops and "Gather" in plain_ops
    _check(plain, model)


def test_shape_start_attribute(monkeypatch):
    # Shape(x, start=1) is [6]: index 0 is the static dim
    model = _chunk_model([0], start=1, opset=15)
    sess, ops = _ops(model, True, monkeypatch)
    assert ops == ["Slice", "Slice", "Add"], ops
    _check(sess, model)


def test_free_dim_stays():
    model = _chunk_model([0])  # batch: not static
    sess, ops = _ops(model)
    assert "Shape" in ops and "Gather" in ops
    x = np.arange(36, dtype=np.float32).reshape(6, 6)  # batch 6: d = 2
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x[:, :2] + x[:, 2:4])


def test_two_dims_one_free_stays():
    model = _chunk_model([0, 1])
    nodes_ok = True
    try:
        _, ops = _ops(model)
    except Exception:  # a [2]-shaped bound is not a valid Slice here either way
        nodes_ok = False
    if nodes_ok:
        assert "Gather" in ops


def test_out_of_range_index_is_left_to_the_run():
    model = _chunk_model([2])
    sess, ops = _ops(model)
    assert "Gather" in ops
    with pytest.raises(Exception, match="(?i)index|range|bound"):
        sess.run(None, {"x": np.zeros((2, 6), np.float32)})


def test_shape_also_read_elsewhere_stays():
    model = _chunk_model([1])
    m = onnx.load_from_string(model)
    m.graph.output.append(helper.make_tensor_value_info("s", TensorProto.INT64, None))
    model = m.SerializeToString()
    sess, ops = _ops(model)
    assert ops.count("Shape") == 1 and "Gather" not in ops
    x = np.zeros((3, 6), np.float32)
    assert list(sess.run(None, {"x": x})[1]) == [3, 6]
