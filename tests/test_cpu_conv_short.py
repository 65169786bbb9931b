"""1-D convolutions of a few output positions in one compiled call (``conv_short``): the
loop against a float64 reference over shapes, pads, strides and dilations; few_columns'
bits where that loop ran before; Relu as stored; sessions against onnxruntime; which
convs take it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnxep
from onnxep.providers_cpu import jit
from onnxep.providers_cpu.ops import conv_short, few_columns

pytestmark = pytest.mark.skipif(not jit.ENABLED, reason="numba not available")


def _reference(x, w, b, stride, dil, pb, length):
    n, c, lin = x.shape
    m, _, k = w.shape
    y = np.zeros((n, m, length))
    for o in range(length):
        for kk in range(k):
            pos = o * stride - pb + kk * dil
            if 0 <= pos < lin:
                y[:, :, o] += np.einsum("nc,mc->nm", x[:, :, pos].astype(np.float64), w[:, :, kk])
    return y + b[None, :, None]


def _aug(w, b):
    return np.ascontiguousarray(np.concatenate([w.reshape(w.shape[0], -1), b[:, None]], axis=1))


@pytest.mark.parametrize(
    "n, c, m, k, stride, dil, pb, lin",
    [
        (1, 129, 128, 3, 1, 1, 1, 3),  # silero's first encoder conv
        (1, 64, 64, 3, 2, 1, 1, 2),  # one position
        (2, 128, 64, 3, 2, 1, 1, 3),
        (3, 1, 258, 256, 128, 1, 0, 832),  # the STFT as a conv, five positions
        (1, 5, 7, 5, 1, 2, 3, 4),  # dilation, wide padding
        (2, 3, 1, 1, 1, 1, 0, 6),
        (1, 17, 9, 4, 3, 1, 2, 9),
    ],
)
def test_loop_against_float64(n, c, m, k, stride, dil, pb, lin):
    rng = np.random.default_rng(n + c + m + k)
    x = rng.standard_normal((n, c, lin)).astype(np.float32)
    w = rng.standard_normal((m, c, k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    length = (lin + 2 * pb - dil * (k - 1) - 1) // stride + 1
    assert 0 < length <= conv_short.MAX_POSITIONS
    want = _reference(x, w, b, stride, dil, pb, length)
    for relu in (False, True):
        y = conv_short.plan(_aug(w, b), (n, m, length), k, stride, dil, pb, relu)(x)
        expect = np.maximum(want, 0) if relu else want
        scale = np.abs(w).sum() / m * np.abs(x).max() + 1
        np.testing.assert_allclose(y, expect, rtol=1e-5, atol=2e-6 * scale)
    # a strided input gives the same bits
    wide = np.repeat(x, 2, axis=2)[:, :, ::2]
    core = conv_short.plan(_aug(w, b), (n, m, length), k, stride, dil, pb, False)
    np.testing.assert_array_equal(core(wide), core(x))


@pytest.mark.parametrize("length", [2, 3, 5, 6])
def test_few_columns_bits(length):
    # 2-6 positions: the rows few_columns made from the im2col columns, so its bits
    rng = np.random.default_rng(length)
    c, m, k = 64, 128, 3
    x = rng.standard_normal((1, c, length + 2)).astype(np.float32)
    w = rng.standard_normal((m, c, k)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    aug = _aug(w, b)
    cols = np.ones((c * k + 1, length), np.float32)
    for o in range(length):
        cols[: c * k, o] = x[0, :, o : o + k].reshape(-1)
    want = np.empty((m, length), np.float32)
    few_columns.product(aug, cols, want)
    got = conv_short.plan(aug, (1, m, length), k, 1, 1, 0, False)(x)
    np.testing.assert_array_equal(got[0], want)


def test_relu_as_stored_and_special_values():
    w = np.ones((8, 2, 1), np.float32)
    b = np.zeros(8, np.float32)
    x = np.array([[[-0.0, np.nan, -1.0, np.inf], [0.0, 0.0, 0.0, 0.0]]], np.float32)
    y = conv_short.plan(_aug(w, b), (1, 8, 4), 1, 1, 1, 0, True)(x)
    assert not np.signbit(y[0, :, 0]).any() and (y[0, :, 0] == 0).all()
    assert np.isnan(y[0, :, 1]).all() and (y[0, :, 2] == 0).all() and np.isposinf(y[0, :, 3]).all()
    plain = conv_short.plan(_aug(w, b), (1, 8, 4), 1, 1, 1, 0, False)(x)
    assert (plain[0, :, 2] == -1).all()


def test_which_convs_take_it(monkeypatch):
    assert conv_short.applies([3], 1, 1, np.float32)
    assert conv_short.applies([256], 1, conv_short.MAX_POSITIONS, np.float32)
    assert not conv_short.applies([3], 1, conv_short.MAX_POSITIONS + 1, np.float32)
    assert not conv_short.applies([3, 3], 1, 2, np.float32)  # 2-D
    assert not conv_short.applies([3], 2, 2, np.float32)  # grouped
    assert not conv_short.applies([3], 1, 2, np.float64)
    assert not conv_short.applies([3], 1, 0, np.float32)
    monkeypatch.setattr(conv_short, "ENABLED", False)
    assert not conv_short.applies([3], 1, 1, np.float32)


def _model(c, m, k, attrs, relu, bias=True):
    rng = np.random.default_rng(c * m + k)
    w = (rng.standard_normal((m, c, k)) * 0.2).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    ins = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(m).astype(np.float32), "b"))
        ins.append("b")
    nodes = [helper.make_node("Conv", ins, ["c" if relu else "y"], **attrs)]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, c, None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize(
    "c, m, k, attrs, lengths",
    [
        (129, 128, 3, {"pads": [1, 1]}, (3, 4, 1)),
        (64, 128, 3, {"pads": [1, 1], "strides": [2]}, (1, 2, 3, 11)),  # 11: 6 positions
        (1, 258, 256, {"strides": [128]}, (576, 640, 832, 2000)),  # 2000: past the bound
        (8, 4, 3, {"pads": [2, 0], "dilations": [2]}, (3, 5)),
        (16, 8, 3, {"auto_pad": "SAME_UPPER", "strides": [2]}, (5, 8)),
        (128, 1, 1, {}, (1, 3, 6, 7)),  # a VAD decoder's pointwise conv; 7: past the bound
        (64, 24, 1, {"strides": [2]}, (1, 4, 11)),
    ],
)
@pytest.mark.parametrize("relu", [False, True])
def test_sessions_against_onnxruntime(c, m, k, attrs, lengths, relu):
    ort = pytest.importorskip("onnxruntime")
    data = _model(c, m, k, attrs, relu)
    ours = onnxep.InferenceSession(data, providers=["cpu"])
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(c + m)
    for _ in range(2):  # the planned run too
        for batch in (1, 2, 3):
            for length in lengths:
                x = rng.standard_normal((batch, c, length)).astype(np.float32)
                got = ours.run(None, {"x": x})[0]
                want = theirs.run(None, {"x": x})[0]
                assert got.shape == want.shape
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_no_bias_empty_batch_and_strided_feed():
    ort = pytest.importorskip("onnxruntime")
    data = _model(32, 64, 3, {"pads": [1, 1]}, True, bias=False)
    ours = onnxep.InferenceSession(data, providers=["cpu"])
    theirs = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((2, 32, 8)).astype(np.float32)[:, :, ::2]
    np.testing.assert_allclose(
        ours.run(None, {"x": x})[0], theirs.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5
    )
    empty = np.zeros((0, 32, 4), np.float32)
    assert ours.run(None, {"x": empty})[0].shape == (0, 64, 4)
