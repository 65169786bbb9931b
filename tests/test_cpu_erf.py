"""The CPU Erf's float32 approximation in one compiled pass (providers_cpu/ops/erf_loops.py):
the NumPy steps' bits (``op_erf.erf32_numpy``) over the float32 range and its special
values, any shape or strides, and Erf nodes against onnxruntime, compiled and NumPy."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxep
from onnxep.providers_cpu import jit
from onnxep.providers_cpu.ops import op_erf

needs_numba = pytest.mark.skipif(not jit.ENABLED, reason="numba not installed")


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).view(np.uint32).tobytes()


@needs_numba
@pytest.mark.parametrize("start", [0, 1, 50])
def test_compiled_pass_has_the_numpy_steps_bits_over_the_float32_range(start):
    x = np.arange(start, 1 << 32, 101, dtype=np.uint64).astype(np.uint32).view(np.float32)
    with np.errstate(all="ignore"):
        want = op_erf.erf32_numpy(x)
    got = op_erf.erf32(x)
    assert got.dtype == np.float32 and got.shape == x.shape
    assert _bits(got) == _bits(want)  # NaN payloads included


@needs_numba
def test_special_values():
    x = np.array(
        [np.nan, -0.0, 0.0, np.inf, -np.inf, 4.0, -4.0, 3.9999998, 1e-45, -1e-38, 6.0, -9.0],
        np.float32,
    )
    got = op_erf.erf32(x)
    with np.errstate(all="ignore"):
        assert _bits(got) == _bits(op_erf.erf32_numpy(x))
    assert np.isnan(got[0]) and np.signbit(got[1]) and not np.signbit(got[2])
    assert abs(got[3] - 1) < 1e-6 and abs(got[4] + 1) < 1e-6


@needs_numba
@pytest.mark.parametrize(
    "make",
    [
        lambda r: r.standard_normal((1, 64, 1024)),
        lambda r: r.standard_normal((3, 5)).T,  # strided
        lambda r: r.standard_normal((4, 6))[:, ::2],
        lambda r: np.array(0.7),  # 0-d
        lambda r: np.zeros((0, 3)),
    ],
)
def test_shapes_and_strides(make):
    x = make(np.random.default_rng(0)).astype(np.float32) * np.float32(2.5)
    got = op_erf.erf32(x)
    assert got.shape == x.shape and got.dtype == np.float32 and got.flags.c_contiguous
    assert _bits(got) == _bits(op_erf.erf32_numpy(x))


def _model(shape, elem=TensorProto.FLOAT):
    graph = helper.make_graph(
        [helper.make_node("Erf", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", elem, shape)],
        [helper.make_tensor_value_info("y", elem, shape)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("shape", [[7], [2, 3, 17], [1, 64, 256]])
def test_erf_node_against_onnxruntime(shape, compiled, monkeypatch):
    if compiled and not jit.ENABLED:
        pytest.skip("numba not installed")
    if not compiled:
        monkeypatch.setattr(jit, "ENABLED", False)
    x = (np.random.default_rng(1).standard_normal(shape) * 3).astype(np.float32)
    data = _model(shape)
    got = onnxep.InferenceSession(data, providers=["cpu"]).run(None, {"x": x})[0]
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    assert _bits(got) == _bits(op_erf.erf32_numpy(x))


def test_float64_keeps_the_generic_kernel():
    x = np.linspace(-3, 3, 11)
    got = onnxep.InferenceSession(_model([11], TensorProto.DOUBLE), providers=["cpu"]).run(
        None, {"x": x}
    )[0]
    assert got.dtype == np.float64
    from math import erf

    np.testing.assert_allclose(got, [erf(v) for v in x], rtol=0, atol=1e-12)
