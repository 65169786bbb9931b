"""The CPU Expand (``providers_cpu/ops/op_expand.py``): against np.broadcast_to and
onnxruntime over bidirectional broadcasts, repeated shapes (its cache), dtypes, empty and
0-d inputs, a target of lower rank, and a mismatch that must raise."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper

import onnxep

ELEM = {np.float32: TensorProto.FLOAT, np.int64: TensorProto.INT64, np.bool_: TensorProto.BOOL}


def _sess(dtype=np.float32):
    m = make_model(
        [helper.make_node("Expand", ["x", "s"], ["y"])],
        [tensor("x", None, ELEM[dtype]), tensor("s", None, TensorProto.INT64)],
        [tensor("y", None, ELEM[dtype])],
        opset=13,
    ).SerializeToString()
    return m, onnxep.InferenceSession(m, providers=["cpu"])


CASES = [
    ((1, 2, 256), [2, 1, 1]),
    ((3, 1), [2, 1, 4]),
    ((3, 1), [4]),
    ((2, 3), [1]),
    ((1,), [0]),
    ((0, 3), [2, 1, 3]),
    ((), [2, 3]),
    ((4, 1, 2), [4, 5, 1]),
]


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
@pytest.mark.parametrize("xs,target", CASES)
def test_against_broadcast_to_and_onnxruntime(xs, target, dtype):
    model, sess = _sess(dtype)
    x = (np.arange(int(np.prod(xs))) % 5).astype(dtype).reshape(xs)
    s = np.array(target, np.int64)
    for _ in range(2):  # the second run takes the cached shape
        got = sess.run(None, {"x": x, "s": s})[0]
        want = np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(target)))
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
        assert got.flags.c_contiguous and got.flags.writeable
    peer = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(got, peer.run(None, {"x": x, "s": s})[0])


def test_same_target_other_input_shapes():
    _, sess = _sess()
    s = np.array([2, 1], np.int64)
    for xs in [(1, 3), (1, 5), (2, 1), (1, 3)]:
        x = np.random.default_rng(0).standard_normal(xs).astype(np.float32)
        got = sess.run(None, {"x": x, "s": s})[0]
        np.testing.assert_array_equal(got, np.broadcast_to(x, np.broadcast_shapes(xs, (2, 1))))


def test_output_is_not_the_input():
    _, sess = _sess()
    x = np.ones((2, 3), np.float32)
    got = sess.run(None, {"x": x, "s": np.array([2, 3], np.int64)})[0]
    got[0, 0] = 5
    assert x[0, 0] == 1


def test_mismatch_raises():
    _, sess = _sess()
    with pytest.raises(Exception, match="(?i)broadcast|shape"):
        sess.run(None, {"x": np.ones((3, 2), np.float32), "s": np.array([4, 3], np.int64)})
