"""The CPU Div's signed-integer path (one ``np.divmod``, the fix-up only when inexact)
against the generic kernel's truncating division and onnxruntime: every signed width,
negative operands, broadcasting, the type's minimum, exact and inexact quotients."""

from __future__ import annotations

import warnings

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxep
from onnxep.providers.ops.op_div import _trunc_div as generic_trunc_div
from onnxep.providers_cpu.ops.op_div import _trunc_div


@pytest.mark.parametrize("dt", [np.int8, np.int16, np.int32, np.int64])
def test_against_the_generic_kernel(dt):
    rng = np.random.default_rng(0)
    info = np.iinfo(dt)
    a = rng.integers(info.min, info.max, size=(40, 7), dtype=dt, endpoint=True)
    a[0] = info.min
    b = rng.integers(-9, 10, size=(7,), dtype=dt)
    b[b == 0] = 3
    exact = (a // b) * b  # every quotient exact: the fast return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the minimum over -1 overflows alike on both
        for x in (a, exact, a[:1, :1]):
            want = generic_trunc_div(np)(x, b if x.shape[1] == 7 else b[:1])
            got = _trunc_div(x, b if x.shape[1] == 7 else b[:1])
            assert got.dtype == want.dtype and got.tolist() == want.tolist()


@pytest.mark.parametrize("elem, dt", [(TensorProto.INT32, np.int32), (TensorProto.INT64, np.int64)])
def test_against_onnxruntime(elem, dt):
    node = helper.make_node("Div", ["a", "b"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("a", elem, [None]),
            helper.make_tensor_value_info("b", elem, [None]),
        ],
        [helper.make_tensor_value_info("y", elem, [None])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    data = model.SerializeToString()
    ours = onnxep.InferenceSession(data, providers=["cpu"])
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for a, b in (([7, -7, 7, -7, 6, 0], [2, 2, -2, -2, 3, 5]), ([512], [128]), ([-9], [4])):
        feeds = {"a": np.array(a, dt), "b": np.array(b, dt)}
        assert ours.run(None, feeds)[0].tolist() == theirs.run(None, feeds)[0].tolist()
