"""x * Sigmoid(x) becomes onnxep::SiLU on the CPU provider, byte-identical to the two nodes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxep

ort = pytest.importorskip("onnxruntime")


def _model(dtype: int, shape: tuple[int, ...], commuted: bool) -> bytes:
    w = numpy_helper.from_array(
        np.random.default_rng(0)
        .standard_normal((4, shape[1], 3, 3))
        .astype(helper.tensor_dtype_to_np_dtype(dtype)),
        "w",
    )
    mul_in = ["s", "c"] if commuted else ["c", "s"]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c"], ["s"]),
        helper.make_node("Mul", mul_in, ["y"]),
    ]
    out_shape = (shape[0], 4, *shape[2:])
    graph = helper.make_graph(
        nodes,
        "silu",
        [helper.make_tensor_value_info("x", dtype, shape)],
        [helper.make_tensor_value_info("y", dtype, out_shape)],
        [w],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m.SerializeToString()


def _plain(model: bytes):
    so = onnxep.SessionOptions(disabled_rewrites=["fuse_silu", "fuse_conv_activation"])
    return onnxep.InferenceSession(model, so, providers=["cpu"])


def _fused(model: bytes):
    # Conv -> SiLU is the Conv's own activation on the CPU (fuse_conv_activation, tested in
    # test_cpu_conv_activation.py); off here, so fuse_silu sees the pair
    so = onnxep.SessionOptions(disabled_rewrites=["fuse_conv_activation"])
    return onnxep.InferenceSession(model, so, providers=["cpu"])


@pytest.mark.parametrize("commuted", [False, True])
@pytest.mark.parametrize(
    ("dtype", "np_dtype"),
    [
        (TensorProto.FLOAT, np.float32),
        (TensorProto.FLOAT16, np.float16),
        (TensorProto.DOUBLE, np.float64),
    ],
)
def test_silu_fuses_and_gives_the_unfused_bytes(dtype, np_dtype, commuted):
    shape = (2, 3, 9, 7)
    model = _model(dtype, shape, commuted)
    x = (np.random.default_rng(1).standard_normal(shape) * 6).astype(np_dtype)
    x.flat[:3] = [-100, 100, 0]  # exp(-x) overflows for the first: the product is -0
    fused = _fused(model)
    report = {f.name: f for f in fused.placement().fusions}["fuse_silu"]
    assert report.fired == 1, report
    assert "SiLU" in [n.op_type for n in fused.placement().nodes]
    (got,) = fused.run(None, {"x": x})
    (want,) = _plain(model).run(None, {"x": x})
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    if np_dtype == np.float64:
        return  # onnxruntime has no float64 Conv
    (peer,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    tol = {np.float16: 2e-2, np.float32: 1e-5, np.float64: 1e-10}[np_dtype]
    np.testing.assert_allclose(got.astype(np.float64), peer.astype(np.float64), rtol=tol, atol=tol)


def test_silu_of_a_0d_value_stays_an_array():
    graph = helper.make_graph(
        [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])],
        "silu0d",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    sess = onnxep.InferenceSession(m.SerializeToString(), providers=["cpu"])
    (y,) = sess.run(None, {"x": np.array(2.0, np.float32)})
    assert isinstance(y, np.ndarray) and y.shape == ()
    np.testing.assert_allclose(y, 2.0 / (1.0 + np.exp(-2.0)), rtol=1e-6)
