"""The CPU provider's NumPy fast paths agree with the generic kernels they shortcut."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper

import onnxep


def test_erf32_accuracy():
    from onnxep.providers_cpu.ops.op_erf import erf32

    xs = np.linspace(-6, 6, 40001).astype(np.float32)
    ref = np.array([math.erf(float(v)) for v in xs])
    err = np.abs(erf32(xs).astype(np.float64) - ref)
    assert err.max() < 5e-7
    tiny = np.array([1e-30, 1e-8, -1e-5], np.float32)
    np.testing.assert_allclose(erf32(tiny), [math.erf(float(v)) for v in tiny], rtol=1e-6)
    assert np.isnan(erf32(np.array([np.nan], np.float32)))[0]


def _one(op, shape, dtype=TensorProto.FLOAT, **attrs):
    return make_model(
        [helper.make_node(op, ["x"], ["y"], **attrs)],
        [tensor("x", shape, dtype)],
        [tensor("y", shape, dtype)],
    )


@pytest.mark.parametrize("op", ["Sigmoid", "Erf"])
def test_fast_unary_matches_generic_at_extremes(op):
    from onnxep.providers.ops import op_erf, op_sigmoid

    generic = {"Sigmoid": op_sigmoid.sigmoid, "Erf": op_erf.erf}[op]
    x = np.array([-1e4, -88.0, -10.0, -1e-3, 0.0, 1e-3, 10.0, 88.0, 1e4], np.float32)
    sess = onnxep.InferenceSession(_one(op, [9]), providers=["cpu"])
    (got,) = sess.run(None, {"x": x})
    want = generic(None, np)(x)[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_rms_norm_fast_path_matches_generic():
    from onnxep.providers.node import NodeInfo
    from onnxep.providers.ops.op_simplified_layer_normalization import (
        simplified_layer_normalization as generic,
    )

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 32)).astype(np.float32)
    w = rng.standard_normal(32).astype(np.float32)
    m = make_model(
        [helper.make_node("SimplifiedLayerNormalization", ["x", "w"], ["y"], epsilon=1e-5)],
        [tensor("x", [2, 5, 32]), tensor("w", [32])],
        [tensor("y", [2, 5, 32])],
    )
    (got,) = onnxep.InferenceSession(m, providers=["cpu"]).run(None, {"x": x, "w": w})
    node = NodeInfo("SimplifiedLayerNormalization", attrs={"epsilon": 1e-5}, outputs=(None,))
    want = generic(node, np)(x, w)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("elem", [TensorProto.FLOAT16, TensorProto.BFLOAT16])
@pytest.mark.parametrize("a_shape", [[2, 3, 64], [64], [4, 1, 5, 64]])
def test_matmul_constant_half_weight_matches_generic_bit_for_bit(elem, a_shape):
    """The weight widened once gives the generic kernel's product exactly (same float32
    operands, same BLAS call), for every broadcast shape; a fed B takes the generic kernel."""
    from onnx import numpy_helper

    from onnxep.providers.node import NodeInfo
    from onnxep.providers.ops.op_mat_mul import mat_mul as generic

    dt = helper.tensor_dtype_to_np_dtype(elem)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 48)).astype(np.float32).astype(dt)
    a = rng.standard_normal(a_shape).astype(np.float32).astype(dt)
    init = numpy_helper.from_array(w, "w")
    if elem == TensorProto.BFLOAT16:  # from_array stores ml_dtypes' bfloat16 as raw bits
        init = helper.make_tensor("w", elem, w.shape, w.view(np.uint16).tobytes(), raw=True)
    node = helper.make_node("MatMul", ["a", "w"], ["y"])
    want = generic(NodeInfo("MatMul", outputs=(None,)), np)(a, w)[0]
    const = make_model([node], [tensor("a", a_shape, elem)], [tensor("y", None, elem)], [init])
    (got,) = onnxep.InferenceSession(const, providers=["cpu"]).run(None, {"a": a})
    assert got.dtype == dt and got.shape == want.shape
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    fed = make_model([node], [tensor("a", a_shape, elem), tensor("w", [64, 48], elem)],
                     [tensor("y", None, elem)])  # fmt: skip
    (got,) = onnxep.InferenceSession(fed, providers=["cpu"]).run(None, {"a": a, "w": w})
    assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
