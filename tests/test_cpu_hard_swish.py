"""The CPU provider's HardSwish (providers_cpu/ops/op_hard_swish.py) against onnxruntime
and, where onnxruntime has no kernel (float64, float16), the generic kernel."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper

import onnxep
from onnxep.testing import TOLERANCES

TYPES = {
    np.float32: TensorProto.FLOAT,
    np.float64: TensorProto.DOUBLE,
    np.float16: TensorProto.FLOAT16,
}


def _model(dtype, shape):
    elem = TYPES[dtype]
    return make_model(
        [helper.make_node("HardSwish", ["x"], ["y"])],
        [tensor("x", shape, elem)],
        [tensor("y", shape, elem)],
        opset=14,
    ).SerializeToString()


def _feed(dtype, shape):
    x = np.asarray(np.random.default_rng(0).standard_normal(shape) * 5, dtype)
    if x.size >= 5:
        x.flat[:5] = [-3, 3, 0, -np.inf, np.inf]  # the clip's corners
    return x


@pytest.mark.parametrize("shape", [[2, 16, 9, 9], [7], [], [0, 3]])
def test_float32_matches_onnxruntime(shape):
    m, x = _model(np.float32, shape), _feed(np.float32, shape)
    got = onnxep.InferenceSession(m, providers=["cpu"])
    want = ort.InferenceSession(m, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for _ in range(2):  # the checked first run, then the direct call
        y = got.run(None, {"x": x})[0]
        assert y.dtype == np.float32 and y.shape == want.shape
        np.testing.assert_array_equal(y, want)


def test_nan_stays_nan():
    m = _model(np.float32, [3])
    y = onnxep.InferenceSession(m, providers=["cpu"]).run(
        None, {"x": np.array([np.nan, 1, -1], np.float32)}
    )[0]
    assert np.isnan(y[0]) and y[1] == np.float32(1) * np.float32(1 / 6 + 0.5)


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_other_floats_match_the_generic_kernel(dtype):
    # onnxruntime has no HardSwish for these; the generic kernel is the reference
    from onnxep.providers.ops.op_hard_swish import hard_swish

    x = _feed(dtype, [4, 33])
    y = onnxep.InferenceSession(_model(dtype, [4, 33]), providers=["cpu"]).run(None, {"x": x})[0]
    (want,) = hard_swish(None, np)(x)
    assert y.dtype == dtype
    rtol, atol = TOLERANCES[np.dtype(dtype)]
    np.testing.assert_allclose(y.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol)
