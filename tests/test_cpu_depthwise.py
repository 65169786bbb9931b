"""The compiled 2-D depthwise loop (``depthwise.depthwise_2d``, numba) against the flat-plane
sums (``depthwise.depthwise``, the NumPy path) bit for bit, and through one-node models
against onnxruntime, on the shapes that reach it: strides 1-3, dilations, asymmetric and
zero pads, channel multipliers, batches, maps from 1x1 to ones whose rows span several
accumulator blocks, and each fused activation."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper, numpy_helper

import onnxep
from onnxep.providers_cpu import jit
from onnxep.providers_cpu.ops import depthwise as dw
from onnxep.providers_cpu.ops.conv_epilogue import Epilogue
from onnxep.providers_cpu.ops.nn_cpu import Scratch

pytestmark = pytest.mark.skipif(not jit.ENABLED, reason="numba not installed: no compiled loop")

# (N, C, H, W, mult, k, strides, dilations, pads top/left/bottom/right)
SHAPES = [
    (1, 16, 112, 112, 1, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    (1, 64, 56, 56, 1, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
    (1, 24, 7, 7, 1, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),
    (2, 5, 13, 9, 1, (7, 7), (1, 1), (1, 1), (3, 3, 3, 3)),
    (1, 3, 41, 29, 2, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    (2, 6, 20, 17, 1, (3, 5), (3, 2), (2, 1), (0, 2, 1, 0)),
    (1, 4, 9, 11, 3, (3, 3), (2, 1), (1, 2), (1, 2, 0, 2)),
    (1, 7, 1, 1, 1, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    (1, 2, 5, 300, 1, (1, 3), (1, 2), (1, 1), (0, 1, 0, 1)),  # rows wider than a block
    (1, 3, 6, 6, 1, (2, 2), (2, 2), (1, 1), (0, 0, 0, 0)),  # no padding, even kernel
    (1, 5, 12, 12, 1, (3, 3), (1, 1), (1, 1), (0, 0, 2, 2)),  # pads at the end only
]


def _out(sp, k, s, d, pb, pe):
    dims = zip(sp, k, s, d, pb, pe)
    return [(n + b + e - (kk - 1) * dd - 1) // ss + 1 for n, kk, ss, dd, b, e in dims]


def _reference(x, w, b, k, s, d, pb, pe):
    """The flat-plane sums (the NumPy path) plus the bias, as op_conv adds it."""
    xpad = Scratch().padded(x, pb, pe)
    out = _out(x.shape[2:], k, s, d, pb, pe)
    y = dw.depthwise(xpad, w.reshape(w.shape[0], 1, -1), k, s, d, out)
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return y, out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES, ids=[str(s[:6]) for s in SHAPES])
def test_compiled_loop_equals_the_flat_plane_sums(shape, dtype, monkeypatch):
    n, c, h, wd, mult, k, s, d, pads = shape
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, h, wd)).astype(dtype)
    w = rng.standard_normal((c * mult, 1, *k)).astype(dtype)
    pb, pe = list(pads[:2]), list(pads[2:])
    for b in (rng.standard_normal(c * mult).astype(dtype), None):
        monkeypatch.setattr(jit, "ENABLED", False)  # the flat sums' NumPy loop
        want, out = _reference(x, w, b, k, s, d, pb, pe)
        monkeypatch.setattr(jit, "ENABLED", True)
        got = dw.depthwise_2d(x, w, b, k, s, d, pb, out)
        assert got.shape == want.shape and got.dtype == dtype
        assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize(
    "name,params",
    [
        ("Relu", None),
        ("Clip", [0.0, 6.0]),
        ("Clip", [-0.25, 0.5]),
        ("HardSigmoid", [0.2, 0.5]),
        ("HardSwish", None),
        ("LeakyRelu", [0.1]),
        ("ClipSwish", [3.0, 0.0, 6.0, 6.0]),
        ("Gelu", [1.4142135, 1.0, 0.5]),
    ],
)
def test_inline_activation_equals_the_numpy_ufuncs(name, params):
    """Each compiled activation gives the bits of the NumPy ufuncs the unfused nodes run."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((2, 6, 15, 13)) * 3).astype(np.float32)
    w = rng.standard_normal((6, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    ep = Epilogue(name, params)
    out = [8, 7]
    plain = dw.depthwise_2d(x, w, b, [3, 3], [2, 2], [1, 1], [1, 1], out)
    plain.reshape(-1)[:4] = [np.nan, -0.0, np.inf, -np.inf]  # the activations' corners
    want = plain.copy()
    ep.numpy(want)
    got = plain.copy()
    ep.apply(got)  # the compiled pass over rows
    assert got.tobytes() == want.tobytes()
    fused = dw.depthwise_2d(x, w, b, [3, 3], [2, 2], [1, 1], [1, 1], out, ep.code, ep.prm(x.dtype))
    ref = dw.depthwise_2d(x, w, b, [3, 3], [2, 2], [1, 1], [1, 1], out)
    ep.numpy(ref)
    assert fused.tobytes() == ref.tobytes()


def _conv_model(c, mult, hw, k, s, pads, dil=(1, 1)):
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((c * mult, 1, *k)) * 0.3).astype(np.float32)
    b = rng.standard_normal(c * mult).astype(np.float32)
    node = helper.make_node(
        "Conv", ["x", "w", "b"], ["y"], group=c, strides=list(s), pads=list(pads),
        dilations=list(dil), kernel_shape=list(k),
    )  # fmt: skip
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    model = make_model(
        [node], [tensor("x", [1, c, *hw])], [tensor("y", None, TensorProto.FLOAT)], inits
    )
    return model.SerializeToString()


@pytest.mark.parametrize(
    "c,mult,hw,k,s,pads",
    [
        (32, 1, (40, 30), (3, 3), (2, 2), (1, 1, 1, 1)),
        (48, 1, (7, 7), (5, 5), (1, 1), (2, 2, 2, 2)),
        (9, 2, (23, 17), (7, 7), (1, 1), (3, 3, 3, 3)),
        (16, 1, (15, 15), (3, 3), (2, 2), (0, 0, 1, 1)),
    ],
)
def test_one_node_models_match_onnxruntime(c, mult, hw, k, s, pads):
    model = _conv_model(c, mult, hw, k, s, pads)
    x = np.random.default_rng(3).standard_normal((1, c, *hw)).astype(np.float32)
    got = onnxep.InferenceSession(model, providers=["cpu"]).run(None, {"x": x})[0]
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
