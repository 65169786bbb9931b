"""The CPU provider's Gather on a strided view (providers_cpu/ops/op_gather.py): indexing
instead of np.take, the same values and the same errors as the generic kernel."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxep

ort = pytest.importorskip("onnxruntime")


def _model(shape, perm, axis, indices, const: bool):
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], perm=list(perm)),
        helper.make_node("Gather", ["t", "i"], ["y"], axis=axis),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))]
    inits = []
    if const:
        inits.append(numpy_helper.from_array(indices, "i"))
    else:
        inputs.append(helper.make_tensor_value_info("i", TensorProto.INT64, list(indices.shape)))
    graph = helper.make_graph(
        nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize(
    ("axis", "indices"),
    [
        (0, np.array(5)),
        (0, np.array(-1)),
        (1, np.array(0)),
        (2, np.array([3, 0, -2, 3])),
        (0, np.array([[1, 2], [19, -20]])),
        (1, np.zeros((0,), np.int64)),
    ],
)
@pytest.mark.parametrize("const", [True, False])
def test_gather_from_a_transposed_view(axis, indices, const):
    shape, perm = (2, 40, 20), (2, 0, 1)  # a [20, 2, 40] view, time steps along its axis 0
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    indices = indices.astype(np.int64)
    model = _model(shape, perm, axis, indices, const)
    feeds = {"x": x} if const else {"x": x, "i": indices}
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    peer = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for _ in range(2):
        got = sess.run(None, feeds)[0]
        assert got.dtype == want.dtype and got.shape == want.shape and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, peer.run(None, feeds)[0])


def test_an_index_out_of_range_names_it():
    x = np.zeros((2, 40, 20), np.float32)
    model = _model(x.shape, (2, 0, 1), 0, np.array([1, 20]), const=False)
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    with pytest.raises(onnxep.errors.RunError, match="20"):
        sess.run(None, {"x": x, "i": np.array([1, 20], np.int64)})
    # the session stays usable
    got = sess.run(None, {"x": x, "i": np.array([1, 19], np.int64)})[0]
    assert got.shape == (2, 2, 40)


def _fed_model(x_shape, axis, idx_dtype=TensorProto.INT64):
    graph = helper.make_graph(
        [helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape)),
            helper.make_tensor_value_info("i", idx_dtype, None),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.mark.parametrize(
    ("axis", "indices"),
    [
        (0, np.array([3, -1])),  # an embedding's token ids, one counted from the end
        (0, np.array(-20)),
        (0, np.array([[0, 19], [-20, 2]])),
        (1, np.array([2, -3, 0])),
        (-1, np.array([4])),
        (0, np.zeros(0, np.int64)),
    ],
)
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_fed_indices_take_the_values_of_the_generic_kernel(axis, indices, dtype):
    model = _fed_model((20, 6, 5), axis, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    x = np.random.default_rng(0).normal(size=(20, 6, 5)).astype(np.float32)
    feeds = {"x": x, "i": indices.astype(dtype)}
    got = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    for _ in range(2):  # the checked first run, then the generated plan
        y = got.run(None, feeds)[0]
        np.testing.assert_array_equal(y, np.take(x, indices, axis=axis))
    np.testing.assert_array_equal(y, ReferenceEvaluator(model).run(None, feeds)[0])


@pytest.mark.parametrize("bad", [np.array([1, 20]), np.array([-21, 0]), np.array(99)])
def test_fed_index_out_of_range_names_it(bad):
    model = _fed_model((20, 3), 0)
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    x = np.ones((20, 3), np.float32)
    sess.run(None, {"x": x, "i": np.array([0])})
    with pytest.raises(onnxep.errors.OnnxepError, match=r"indices value -?\d+ .* size 20"):
        sess.run(None, {"x": x, "i": bad})
