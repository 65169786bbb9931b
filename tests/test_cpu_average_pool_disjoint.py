"""AveragePool over windows that tile the input (strides equal to the kernel, no padding):
one compiled pass (providers_cpu/ops/pool_loops.py) with the general path's bits, and the
geometries that keep the general path, against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxep

ort = pytest.importorskip("onnxruntime")


def _model(kernel, strides=None, pads=None, ceil_mode=0, include_pad=0, opset=19):
    attrs = {"kernel_shape": list(kernel), "strides": list(strides or kernel)}
    if pads is not None:
        attrs["pads"] = list(pads)
    if ceil_mode:
        attrs["ceil_mode"] = 1
    if include_pad:
        attrs["count_include_pad"] = 1
    graph = helper.make_graph(
        [helper.make_node("AveragePool", ["x"], ["y"], **attrs)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model.SerializeToString()


def _both(model, x, monkeypatch):
    from onnxep.providers_cpu import jit

    fast = onnxep.InferenceSession(model, providers=["cpu"]).run(None, {"x": x})[0]
    with monkeypatch.context() as m:
        m.setattr(jit, "ENABLED", False)
        slow = onnxep.InferenceSession(model, providers=["cpu"]).run(None, {"x": x})[0]
    return fast, slow


def _spy(monkeypatch):
    """Records the compiled loop's calls (none where it cannot be imported: numba off)."""
    calls = []
    try:
        from onnxep.providers_cpu.ops import pool_loops
    except ImportError:
        return calls
    real = pool_loops.average_disjoint
    monkeypatch.setattr(pool_loops, "average_disjoint", lambda *a: calls.append(1) or real(*a))
    return calls


@pytest.mark.parametrize(
    ("shape", "kernel"),
    [
        ((1, 480, 6, 40), (3, 2)),  # a text recogniser's
        ((2, 5, 7, 41), (3, 2)),  # rows and columns past the last window are not read
        ((1, 3, 8, 8), (2, 2)),
        ((2, 4, 9, 9), (3, 3)),
        ((1, 2, 5, 6), (1, 2)),
        ((1, 2, 6, 5), (2, 1)),
        ((3, 1, 4, 4), (4, 4)),  # one window a plane
    ],
)
def test_disjoint_windows_compiled_with_the_general_paths_bits(
    compiled, shape, kernel, monkeypatch
):
    x = (np.random.default_rng(0).standard_normal(shape) * 3).astype(np.float32)
    x.reshape(-1)[:3] = [np.nan, np.inf, -0.0]
    calls = _spy(monkeypatch)
    model = _model(kernel)
    fast, slow = _both(model, x, monkeypatch)
    assert bool(calls) == compiled
    assert fast.tobytes() == slow.tobytes()
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(fast, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "geometry",
    [
        {"kernel": (3, 2), "strides": (2, 2)},  # overlapping rows
        {"kernel": (2, 2), "pads": (1, 1, 1, 1)},
        {"kernel": (2, 2), "pads": (1, 1, 1, 1), "include_pad": 1},
        {"kernel": (3, 2), "ceil_mode": 1},  # a last, partial window
    ],
)
def test_other_geometries_keep_the_general_path(geometry, monkeypatch):
    x = np.random.default_rng(1).standard_normal((2, 3, 7, 9)).astype(np.float32)
    calls = _spy(monkeypatch)
    model = _model(**geometry)
    fast, slow = _both(model, x, monkeypatch)
    assert not calls
    assert fast.tobytes() == slow.tobytes()
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(fast, want, rtol=1e-6, atol=1e-6)


def test_empty_and_float64_and_strided(monkeypatch):
    model = _model((2, 2))
    empty = np.zeros((0, 3, 4, 4), np.float32)
    fast, slow = _both(model, empty, monkeypatch)
    assert fast.shape == slow.shape == (0, 3, 2, 2)
    x = np.random.default_rng(2).standard_normal((2, 6, 8, 8)).astype(np.float32)[:, ::2]
    fast, slow = _both(model, x, monkeypatch)
    assert fast.tobytes() == slow.tobytes()
