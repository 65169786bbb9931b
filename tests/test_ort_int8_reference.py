"""The int8 reference the contrib tests give onnxruntime (tests/ort_int8_reference.py): on any
x86 CPU its results are the exact integer products, whether the int8 weight is an
initializer, a feed or made by another node (on a CPU without VNNI onnxruntime's own u8 x s8
kernel saturates; elsewhere the model is left as it is)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

ort = pytest.importorskip("onnxruntime")
import ort_int8_reference  # noqa: E402 - after onnxruntime is known to be there

M, K, N = 3, 64, 5


def _model(source: str) -> tuple[onnx.ModelProto, dict, np.ndarray]:
    rng = np.random.default_rng(0)
    a = np.full((M, K), 255, np.uint8)  # pair sums past int16: where the saturation shows
    a[1] = rng.integers(0, 256, K)
    b = rng.integers(-128, 128, (K, N)).astype(np.int8)
    b[:, 0] = 127
    inputs = [helper.make_tensor_value_info("a", TensorProto.UINT8, [M, K])]
    inits, nodes, feeds = [], [], {"a": a}
    b_name = "b"
    if source == "initializer":
        inits.append(numpy_helper.from_array(b, "b"))
    elif source == "feed":
        inputs.append(helper.make_tensor_value_info("b", TensorProto.INT8, [K, N]))
        feeds["b"] = b
    else:  # made by a node
        inits.append(numpy_helper.from_array(b, "b0"))
        nodes.append(helper.make_node("Identity", ["b0"], ["b"]))
    nodes.append(helper.make_node("MatMulInteger", ["a", b_name], ["y"]))
    graph = helper.make_graph(
        nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.INT32, [M, N])], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return model, feeds, a.astype(np.int64) @ b.astype(np.int64)


@pytest.mark.parametrize("source", ["initializer", "feed", "node"])
def test_the_reference_is_the_exact_product(source):
    model, feeds, exact = _model(source)
    ref_model, ref_feeds = ort_int8_reference.reference(model, feeds)
    onnx.checker.check_model(ref_model)
    sess = ort.InferenceSession(ref_model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, ref_feeds)[0], exact)
    assert feeds["a"] is not None and model.graph.node[-1].input[1] == "b"  # inputs unchanged
