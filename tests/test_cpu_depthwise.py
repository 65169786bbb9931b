"""The compiled 2-D depthwise loop (``depthwise.depthwise_2d``, numba) against the flat-plane
sums (``depthwise.depthwise``, the NumPy path: multiply then add, where the compiled loops
fuse them, so within rounding), its two loops against each other bit for bit, and through
one-node models
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
def test_compiled_loop_matches_the_flat_plane_sums(shape, dtype, monkeypatch):
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
        # one rounding a term against two: a few units in the last place of the sum's terms
        eps = np.finfo(dtype).eps
        scale = np.abs(x).max() * np.abs(w).max() * np.prod(k) + 1
        np.testing.assert_allclose(got, want, rtol=0, atol=8 * eps * scale)


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


# Shapes the channels-in-vector loop takes (``depthwise.channels_last``): (N, C, H, W, k,
# strides, dilations, pads); channel counts that leave a short last block, batches whose
# blocks straddle two images, strides 1-3, dilations, asymmetric and zero pads, 1x1 maps,
# maps shorter than the kernel.
CL_SHAPES = [
    (1, 512, 7, 7, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),
    (1, 96, 14, 14, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    (1, 37, 9, 11, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
    (2, 40, 8, 8, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    (1, 64, 56, 56, (3, 3), (2, 2), (1, 1), (1, 1, 1, 1)),
    (1, 33, 20, 17, (3, 5), (3, 2), (2, 1), (0, 2, 1, 0)),
    (1, 48, 9, 11, (3, 3), (2, 1), (1, 2), (1, 2, 0, 2)),
    (1, 32, 1, 1, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    (1, 32, 6, 6, (2, 2), (2, 2), (1, 1), (0, 0, 0, 0)),
    (1, 50, 12, 12, (3, 3), (1, 1), (1, 1), (0, 0, 2, 2)),
    (3, 17, 5, 5, (7, 7), (1, 1), (1, 1), (3, 3, 3, 3)),
    # maps shorter than the kernel: tiles of one output row skip the border's rows
    (2, 40, 2, 24, (5, 5), (1, 1), (1, 1), (2, 2, 2, 2)),
    (1, 24, 3, 16, (5, 5), (2, 1), (1, 1), (2, 2, 2, 2)),
    (1, 16, 2, 13, (3, 3), (1, 1), (2, 1), (2, 1, 2, 1)),
    # column stride 2 on even widths: the flat loop reads 64-bit pairs (first column of
    # a phase even or odd: both halves), a batch, a column dilation
    (2, 24, 10, 14, (3, 3), (2, 2), (1, 1), (0, 1, 1, 0)),
    (1, 16, 8, 12, (3, 3), (1, 2), (1, 1), (1, 0, 1, 1)),
    (1, 20, 9, 16, (3, 3), (2, 2), (2, 2), (2, 3, 2, 3)),
]


def _flat_loop(x, w, b, k, s, d, pb, out, code=0, prm=None):
    """``_depthwise_2d`` (the flat-plane loop) on every row, as depthwise_2d ran it before."""
    n, c = x.shape[:2]
    y = np.empty((n, c, *out), x.dtype)
    bv = b if b is not None else np.zeros(1, x.dtype)
    prm = np.zeros(8, x.dtype) if prm is None else prm
    geo = (k[0], k[1], s[0], s[1], d[0], d[1], pb[0], pb[1])
    f = jit.loop("depthwise_2d")
    f(x.reshape(n * c, *x.shape[2:]), w.reshape(c, -1), bv, b is not None, 1, geo, *out,
      code, prm, 0, n * c, y.reshape(n * c, -1))  # fmt: skip
    return y


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", CL_SHAPES, ids=[str(s[:5]) for s in CL_SHAPES])
def test_channels_last_loop_equals_the_flat_plane_loop(shape, dtype, threads, monkeypatch):
    from onnxep.providers_cpu.ops import nn_cpu

    n, c, h, wd, k, s, d, pads = shape
    # chunks of channel blocks over the provider's pool, as a two-thread run splits them
    monkeypatch.setattr(nn_cpu, "run_threads", lambda: threads)
    monkeypatch.setattr(nn_cpu, "_PARALLEL_MIN", 0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, h, wd)).astype(dtype)
    x.reshape(-1)[::97] = np.nan
    x.reshape(-1)[5::89] = -0.0
    x.reshape(-1)[7::101] = np.inf
    w = rng.standard_normal((c, 1, *k)).astype(dtype)
    pb, pe = list(pads[:2]), list(pads[2:])
    out = _out((h, wd), k, s, d, pb, pe)
    lanes = jit.vector_bytes() // np.dtype(dtype).itemsize
    assert dw.channels_last(c, 1, out, dtype) == (c >= 2 * lanes or (c >= lanes and h < 16))
    for b in (rng.standard_normal(c).astype(dtype), None):
        got = dw.depthwise_2d(x, w, b, k, s, d, pb, out)
        want = _flat_loop(x, w, b, k, s, d, pb, out)
        assert got.tobytes() == want.tobytes()
        cl = np.empty_like(want)
        # the loop itself on every shape here, short of the rule's channel count or not
        wt = dw.transposed_weights(w, k)
        bv = b if b is not None else np.zeros(1, dtype)
        geo = (k[0], k[1], s[0], s[1], d[0], d[1], pb[0], pb[1])
        jit.loop("depthwise_2d_cl")(
            x.reshape(n * c, h, wd), wt, bv, b is not None, geo, *out, lanes, 0,
            np.zeros(8, dtype), 0, n * c, cl.reshape(n * c, -1),
        )  # fmt: skip
        assert cl.tobytes() == want.tobytes()


@pytest.mark.parametrize("name,params", [("Relu", None), ("Clip", [0.0, 6.0]), ("HardSwish", None)])
def test_channels_last_loop_applies_the_activation_inline(name, params):
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((1, 80, 7, 7)) * 3).astype(np.float32)
    w = rng.standard_normal((80, 1, 3, 3)).astype(np.float32)
    b = rng.standard_normal(80).astype(np.float32)
    ep = Epilogue(name, params)
    args = ([3, 3], [1, 1], [1, 1], [1, 1], [7, 7])
    assert dw.channels_last(80, 1, [7, 7], np.float32)
    fused = dw.depthwise_2d(x, w, b, *args, ep.code, ep.prm(x.dtype))
    want = _flat_loop(x, w, b, *args, ep.code, ep.prm(x.dtype))
    assert fused.tobytes() == want.tobytes()
    ref = dw.depthwise_2d(x, w, b, *args)
    ep.numpy(ref)
    assert fused.tobytes() == ref.tobytes()


@pytest.mark.parametrize(
    "c,hw,k,s,pads",
    [
        (512, (7, 7), (5, 5), (1, 1), (2, 2, 2, 2)),
        (72, (14, 14), (3, 3), (2, 2), (1, 1, 1, 1)),
        (40, (9, 13), (5, 5), (1, 1), (2, 2, 2, 2)),
    ],
)
def test_channels_last_models_match_onnxruntime(c, hw, k, s, pads):
    model = _conv_model(c, 1, hw, k, s, pads)
    x = np.random.default_rng(3).standard_normal((1, c, *hw)).astype(np.float32)
    for threads in (1, 2):
        so = onnxep.SessionOptions(intra_op_num_threads=threads)
        got = onnxep.InferenceSession(model, so, providers=["cpu"]).run(None, {"x": x})[0]
        want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
        np.testing.assert_allclose(got, want[0], rtol=1e-5, atol=1e-5)
