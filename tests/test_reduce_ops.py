"""Reductions, softmax, normalizations, losses and linear algebra beyond the node suite.

Legacy opsets (attribute axes, 2-D coerced softmax, BatchNormalization's
old training outputs and ``spatial=0``, GroupNormalization-18 per-group
scale), integer and narrow-float dtypes, and empty-set reductions.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import helper

import onnxep
from onnxep.providers.dtypes import elem_type

BF16 = np.dtype(ml_dtypes.bfloat16)


def run_node(op, inputs, attrs=None, opset=21, nout=1, out_dtypes=None):
    """Run a one-node model; ``None`` inputs are omitted. Returns every output."""
    names = ["" if a is None else f"x{i}" for i, a in enumerate(inputs)]
    outs = [f"y{j}" for j in range(nout)]
    node = helper.make_node(op, names, outs, **(attrs or {}))
    g_in = [
        helper.make_tensor_value_info(n, elem_type(a.dtype), list(a.shape))
        for n, a in zip(names, inputs)
        if a is not None
    ]
    odt = out_dtypes or [inputs[0].dtype] * nout
    g_out = [helper.make_tensor_value_info(o, elem_type(d), None) for o, d in zip(outs, odt)]
    graph = helper.make_graph([node], "g", g_in, g_out)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    return sess.run(None, {n: a for n, a in zip(names, inputs) if a is not None})


def axes(*a):
    return np.array(a, dtype=np.int64)


@pytest.fixture
def x(rng):
    return rng.standard_normal((2, 3, 4)).astype(np.float32)


@pytest.mark.parametrize(
    "op,ref",
    [
        ("ReduceSum", np.sum),
        ("ReduceMean", np.mean),
        ("ReduceMax", np.max),
        ("ReduceMin", np.min),
        ("ReduceProd", np.prod),
        ("ReduceL1", lambda a, **k: np.sum(np.abs(a), **k)),
        ("ReduceSumSquare", lambda a, **k: np.sum(a * a, **k)),
    ],
)
def test_attribute_axes_before_opset_13(op, ref, x):
    (y,) = run_node(op, [x], {"axes": [0, -1], "keepdims": 0}, opset=11)
    np.testing.assert_allclose(y, ref(x, axis=(0, 2)), rtol=1e-5)
    (y,) = run_node(op, [x], {}, opset=11)
    assert y.shape == (1, 1, 1)
    np.testing.assert_allclose(y, ref(x, keepdims=True), rtol=1e-5)


@pytest.mark.parametrize(
    "op,fill",
    [
        ("ReduceMax", np.iinfo(np.int8).min),
        ("ReduceMin", np.iinfo(np.int8).max),
        ("ReduceSum", 0),
        ("ReduceProd", 1),
    ],
)
def test_empty_set_integer_identity(op, fill):
    e = np.zeros((2, 0, 3), dtype=np.int8 if op in ("ReduceMax", "ReduceMin") else np.int32)
    (y,) = run_node(op, [e, axes(1)], {"keepdims": 0}, opset=20)
    assert y.shape == (2, 3) and y.dtype == e.dtype
    assert np.all(y == fill)


def test_empty_set_reduce_min_float_is_inf():
    (y,) = run_node("ReduceMin", [np.zeros((0, 2), np.float32), axes(0)], opset=18)
    assert y.shape == (1, 2) and np.all(y == np.inf)


def test_empty_set_log_sum_exp_keepdims_false():
    (y,) = run_node("ReduceLogSumExp", [np.zeros((2, 0), np.float32)], {"keepdims": 0}, opset=18)
    assert y.shape == () and y == -np.inf


def test_noop_with_empty_axes_keeps_elementwise_part(x):
    attrs = {"noop_with_empty_axes": 1}
    (y,) = run_node("ReduceSumSquare", [x, axes()], attrs, opset=18)
    np.testing.assert_allclose(y, x * x)
    (y,) = run_node("ReduceL1", [x], attrs, opset=18)
    np.testing.assert_allclose(y, np.abs(x))
    (y,) = run_node("ReduceSum", [x], attrs, opset=13)
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint32])
def test_integer_reductions_keep_dtype(dtype, rng):
    a = rng.integers(0, 50, (3, 4)).astype(dtype)
    for op, ref in [("ReduceSum", a.sum(1)), ("ReduceMean", a.mean(1).astype(dtype))]:
        (y,) = run_node(op, [a, axes(1)], {"keepdims": 0}, opset=18)
        assert y.dtype == dtype
        np.testing.assert_array_equal(y, ref)


@pytest.mark.parametrize("dtype", [np.float16, BF16])
@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceL2", "ReduceLogSumExp"])
def test_narrow_float_reductions(op, dtype, rng):
    a = rng.random((4, 300)).astype(dtype)
    (y,) = run_node(op, [a, axes(1)], opset=18)
    assert y.dtype == dtype and y.shape == (4, 1)
    f = a.astype(np.float32)
    ref = {
        "ReduceSum": f.sum(1, keepdims=True),
        "ReduceMean": f.mean(1, keepdims=True),
        "ReduceL2": np.sqrt((f * f).sum(1, keepdims=True)),
        "ReduceLogSumExp": np.log(np.exp(f).sum(1, keepdims=True)),
    }[op]
    np.testing.assert_allclose(y.astype(np.float32), ref, rtol=1e-2)


def test_reduce_bool_max_min():
    b = np.array([[True, False], [False, False]])
    (y,) = run_node("ReduceMax", [b, axes(1)], {"keepdims": 0}, opset=20)
    np.testing.assert_array_equal(y, [True, False])
    (y,) = run_node("ReduceMin", [b, axes(0)], {"keepdims": 0}, opset=20)
    np.testing.assert_array_equal(y, [False, False])


def _softmax2d(x, axis):
    f = x.reshape(int(np.prod(x.shape[:axis])), -1)
    e = np.exp(f - f.max(1, keepdims=True))
    return (e / e.sum(1, keepdims=True)).reshape(x.shape)


def test_softmax_before_13_coerces_to_2d(x):
    (y,) = run_node("Softmax", [x], {"axis": 1}, opset=11)
    np.testing.assert_allclose(y, _softmax2d(x, 1), rtol=1e-5)
    (y,) = run_node("LogSoftmax", [x], {}, opset=11)
    np.testing.assert_allclose(y, np.log(_softmax2d(x, 1)), rtol=1e-5, atol=1e-6)


def test_hardmax_before_13_coerces_to_2d(x):
    (y,) = run_node("Hardmax", [x], {"axis": 1}, opset=11)
    f = x.reshape(2, 12)
    ref = np.zeros_like(f)
    ref[np.arange(2), f.argmax(1)] = 1
    np.testing.assert_array_equal(y, ref.reshape(x.shape))


def test_softmax_float16_large_values():
    a = np.array([[60000, 60000, -60000]], dtype=np.float16)
    (y,) = run_node("Softmax", [a], opset=13)
    np.testing.assert_allclose(y.astype(np.float32), [[0.5, 0.5, 0.0]])


@pytest.fixture
def bn_inputs(rng):
    x = rng.standard_normal((4, 3, 2, 2)).astype(np.float32)
    s, b, m = (rng.standard_normal(3).astype(np.float32) for _ in range(3))
    v = rng.random(3).astype(np.float32) + 0.5
    return x, s, b, m, v


def _bn(x, s, b, m, v, eps=1e-5):
    r = lambda a: a.reshape(-1, 1, 1)  # noqa: E731
    return (x - r(m)) / np.sqrt(r(v) + eps) * r(s) + r(b)


@pytest.mark.parametrize("opset", [7, 9, 14, 15])
def test_batchnorm_training_outputs(opset, bn_inputs):
    x, s, b, m, v = bn_inputs
    attrs = {"training_mode": 1, "momentum": 0.8} if opset >= 14 else {"momentum": 0.8}
    outs = run_node("BatchNormalization", [x, s, b, m, v], attrs, opset, 3 if opset >= 14 else 5)
    bm, bv = x.mean((0, 2, 3)), x.var((0, 2, 3))
    np.testing.assert_allclose(outs[0], _bn(x, s, b, bm, bv), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(outs[1], m * 0.8 + bm * 0.2, rtol=1e-5)
    np.testing.assert_allclose(outs[2], v * 0.8 + bv * 0.2, rtol=1e-5)
    if opset < 14:
        np.testing.assert_allclose(outs[3], bm, rtol=1e-5)
        np.testing.assert_allclose(outs[4], bv, rtol=1e-5)


def test_batchnorm_is_test_and_spatial0(bn_inputs, rng):
    x, s, b, m, v = bn_inputs
    (y,) = run_node("BatchNormalization", [x, s, b, m, v], {"is_test": 1}, opset=6)
    np.testing.assert_allclose(y, _bn(x, s, b, m, v), rtol=1e-5, atol=1e-6)
    S, B, M = (rng.standard_normal((3, 2, 2)).astype(np.float32) for _ in range(3))
    V = rng.random((3, 2, 2)).astype(np.float32) + 0.5
    (y,) = run_node("BatchNormalization", [x, S, B, M, V], {"spatial": 0}, opset=7)
    np.testing.assert_allclose(y, (x - M) / np.sqrt(V + 1e-5) * S + B, rtol=1e-5, atol=1e-6)


def test_group_norm_18_per_group_21_per_channel(rng):
    x = rng.standard_normal((2, 6, 3)).astype(np.float32)
    xg = x.reshape(2, 3, -1)
    xg = (xg - xg.mean(2, keepdims=True)) / np.sqrt(xg.var(2, keepdims=True) + 1e-5)
    n = xg.reshape(x.shape)
    sg, bg = rng.standard_normal(3).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    (y,) = run_node("GroupNormalization", [x, sg, bg], {"num_groups": 3}, opset=18)
    ref = n * np.repeat(sg, 2)[:, None] + np.repeat(bg, 2)[:, None]
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    sc, bc = rng.standard_normal(6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    (y,) = run_node("GroupNormalization", [x, sc, bc], {"num_groups": 3}, opset=21)
    np.testing.assert_allclose(y, n * sc[:, None] + bc[:, None], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_layer_norm_narrow_float_stats_are_float32(dtype, rng):
    x = rng.standard_normal((2, 3, 8)).astype(dtype)
    s = np.ones(8, dtype=dtype)
    f32 = np.dtype(np.float32)
    outs = run_node("LayerNormalization", [x, s], {}, 17, 3, [x.dtype, f32, f32])
    assert outs[0].dtype == dtype and outs[1].dtype == f32 and outs[2].shape == (2, 3, 1)
    f = x.astype(np.float32)
    np.testing.assert_allclose(outs[1], f.mean(-1, keepdims=True), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(outs[2], 1 / np.sqrt(f.var(-1, keepdims=True) + 1e-5), rtol=1e-4)


def test_gemm_integer_and_legacy_broadcast(rng):
    a = rng.integers(-5, 5, (3, 4)).astype(np.int32)
    b = rng.integers(-5, 5, (5, 4)).astype(np.int32)
    c = np.arange(5, dtype=np.int32)
    (y,) = run_node("Gemm", [a, b, c], {"transB": 1}, opset=13)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, a @ b.T + c)
    af, bf = a.astype(np.float32), b.T.astype(np.float32).copy()
    (y,) = run_node("Gemm", [af, bf, np.array([2.0], np.float32)], {"broadcast": 1}, opset=6)
    np.testing.assert_allclose(y, af @ bf + 2)
    (y,) = run_node("Gemm", [af, bf, None], {"alpha": 0.5}, opset=11)
    np.testing.assert_allclose(y, 0.5 * (af @ bf))


@pytest.mark.parametrize(
    "sa,sb", [((2, 3, 4), (4,)), ((4,), (1, 4, 5)), ((4,), (4,)), ((0, 3), (3, 2))]
)
def test_matmul_integer_shapes(sa, sb, rng):
    a = rng.integers(-3, 3, sa).astype(np.int32)
    b = rng.integers(-3, 3, sb).astype(np.int32)
    (y,) = run_node("MatMul", [a, b], opset=13)
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, a @ b)


def test_einsum_uppercase_and_spaces(rng):
    a = rng.standard_normal((2, 3)).astype(np.float32)
    b = rng.standard_normal((3, 4)).astype(np.float32)
    (y,) = run_node("Einsum", [a, b], {"equation": "Ab, bC"}, opset=28)
    np.testing.assert_allclose(y, a @ b, rtol=1e-5)


def test_det_float16(rng):
    d = rng.standard_normal((2, 3, 3)).astype(np.float16)
    (y,) = run_node("Det", [d], opset=22)
    assert y.dtype == np.float16
    np.testing.assert_allclose(y, np.linalg.det(d.astype(np.float32)), rtol=1e-2, atol=1e-3)


def test_losses_int32_targets_out_of_range_ignore_index(rng):
    x = rng.standard_normal((3, 5, 2)).astype(np.float32)
    t = rng.integers(0, 5, (3, 2)).astype(np.int32)
    t[0, 0] = 100
    w = rng.random(5).astype(np.float32)
    loss, logp = run_node(
        "SoftmaxCrossEntropyLoss", [x, t, w], {"ignore_index": 100}, opset=13, nout=2
    )
    lp = x - x.max(1, keepdims=True)
    lp = lp - np.log(np.exp(lp).sum(1, keepdims=True))
    np.testing.assert_allclose(logp, lp, rtol=1e-5, atol=1e-6)
    valid = t != 100
    tc = np.where(valid, t, 0)
    picked = -np.take_along_axis(lp, tc[:, None], 1)[:, 0]
    ww = np.where(valid, w[tc], 0)
    np.testing.assert_allclose(loss, (picked * ww).sum() / ww.sum(), rtol=1e-5)
    (nll,) = run_node(
        "NegativeLogLikelihoodLoss", [lp, t], {"ignore_index": 100, "reduction": "sum"}
    )
    np.testing.assert_allclose(nll, np.where(valid, picked, 0).sum(), rtol=1e-5)


def test_lp_normalization_zero_norm_is_zero():
    a = np.array([[0.0, 0.0], [3.0, 4.0]], dtype=np.float32)
    (y,) = run_node("LpNormalization", [a], {"axis": 1, "p": 2}, opset=22)
    np.testing.assert_allclose(y, [[0, 0], [0.6, 0.8]])
