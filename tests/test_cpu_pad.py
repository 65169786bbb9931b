"""The CPU Pad's remembered one-axis gather (reflect, edge, wrap) against onnx.reference:
each padded axis, both sides and one, the axes input (opset 18), several axes (the
generic kernel), shapes that change between runs and come back, and the generic
kernel's errors on the first and later runs."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import onnxep


def _model(mode, rank, opset, with_axes):
    ins = ["x", "pads"] + (["", "axes"] if with_axes else [])
    node = helper.make_node("Pad", ins, ["y"], mode=mode)
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [None] * rank),
        helper.make_tensor_value_info("pads", TensorProto.INT64, [None]),
    ]
    if with_axes:
        inputs.append(helper.make_tensor_value_info("axes", TensorProto.INT64, [None]))
    graph = helper.make_graph(
        [node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


CASES = [
    # input shape, pads (all axes, or for ``axes``), axes
    ((1, 512), [0, 64, 0, 64], None),  # the VAD frame
    ((1, 512), [0, 0, 0, 64], None),
    ((3, 5, 7), [0, 2, 0, 0, 3, 0], None),
    ((3, 5, 7), [2, 0, 0, 1, 0, 0], None),
    ((2, 6), [2, 5], [-1]),  # axes input: the last axis
    ((4, 3), [1, 1, 2, 2], None),  # two axes: the generic kernel
]


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_against_the_reference(mode, case):
    shape, pads, axes = CASES[case]
    model = _model(mode, len(shape), 19 if mode == "wrap" or axes else 13, axes is not None)
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    ref = ReferenceEvaluator(model)
    rng = np.random.default_rng(case)
    feeds_of = []
    for s in (shape, tuple(n + 1 for n in shape), shape):  # the shape changes and comes back
        f = {"x": rng.standard_normal(s).astype(np.float32), "pads": np.array(pads, np.int64)}
        if axes is not None:
            f["axes"] = np.array(axes, np.int64)
        feeds_of.append(f)
    for f in feeds_of + feeds_of:
        got = sess.run(None, f)[0]
        want = ref.run(None, f)[0]
        assert got.shape == want.shape
        assert got.tobytes() == want.tobytes()


def test_errors_stay_the_generic_kernels():
    model = _model("reflect", 2, 13, False)
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    ok = {"x": np.ones((1, 8), np.float32), "pads": np.array([0, 3, 0, 3], np.int64)}
    assert sess.run(None, ok)[0].shape == (1, 14)
    wide = {"x": np.ones((1, 8), np.float32), "pads": np.array([0, 8, 0, 0], np.int64)}
    for _ in range(2):
        with pytest.raises(Exception, match="reflect"):
            sess.run(None, wide)
    assert sess.run(None, ok)[0].shape == (1, 14)
