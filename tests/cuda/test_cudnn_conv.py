"""Conv, ConvTranspose, FusedConv and the pools through cuDNN on the GPU, against the CPU provider.

The attribute grids are tests/test_cudnn_plan.py's (where the plans and the kernels' glue
are checked on the CPU with a NumPy stand-in for cuDNN); here the real library runs,
on ``["cuda"]`` alone, float32 and float16, within the parity kit's tolerances
(``onnxep.testing.TOLERANCES``). Each model is run four times (two eager warm-ups, the
capture, a replay), and no Conv-family step may be a capture seam: a seam would mean the generic
kernel ran. A whole small CNN must be one captured graph, and a case cuDNN cannot take
(four spatial dims) must say so in the capture plan.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import helper, numpy_helper

import onnxep
from onnxep.testing import TOLERANCES

pytest.importorskip("cupy", reason="the CUDA tests need CuPy and a GPU")

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

import test_cudnn_plan as G  # noqa: E402

DTYPES = {"f32": np.float32, "f16": np.float16}
CONV_OPS = {"Conv", "ConvTranspose", "FusedConv", "MaxPool", "AveragePool"}
CONV_OPS |= {"GlobalAveragePool", "GlobalMaxPool"}


@pytest.fixture(autouse=True, scope="module")
def _needs_cudnn():
    from onnxep.providers_cuda import dnn

    why = dnn.unavailable_reason()
    if why:
        pytest.skip(f"cuDNN is not usable here: {why}")


def _model(nodes, x_shape, dtype, inits, opset=19, ms=False):
    tp = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", tp, list(x_shape))],
        [helper.make_tensor_value_info("y", tp, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    ops = [helper.make_opsetid("", opset)]
    if ms:
        ops.append(helper.make_opsetid("com.microsoft", 1))
    m = helper.make_model(graph, opset_imports=ops)
    m.ir_version = 9
    return m.SerializeToString()


def _compare(model, x, *, seams_ok=False):
    """Run on CUDA alone (4 runs: 2 eager warm-ups, capture, replay) and on the CPU provider."""
    cpu = onnxep.InferenceSession(model, providers=["cpu"])
    (want,) = cpu.run(None, {"x": x})
    sess = onnxep.InferenceSession(model, providers=["cuda"])
    outs = [sess.run(None, {"x": x})[0] for _ in range(4)]
    rtol, atol = TOLERANCES[np.dtype(x.dtype)]
    for got in outs:
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(
            got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol
        )
    plan = sess.capture_plan()
    seams = [r for r in plan.seams if r.op_type in CONV_OPS]
    if not seams_ok:
        assert not seams, plan.format()
    return sess


def _weights(rng, shape, dtype, fan_in):
    return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(dtype)


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("case", G.CONV_GRID, ids=lambda c: f"{len(c[0])}d-{c[4]}-g{c[5]}")
def test_conv_matches_cpu(case, dt):
    sp, kernel, strides, dil, pads, group, (c, m) = case
    dtype = DTYPES[dt]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, c, *sp)).astype(dtype)
    fan = c // group * int(np.prod(kernel))
    inits = {"w": _weights(rng, (m, c // group, *kernel), dtype, fan)}
    inits["b"] = rng.standard_normal(m).astype(dtype)
    attrs = G.conv_attrs(kernel, strides, dil, pads, group)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    _compare(_model([node], x.shape, dtype, inits), x)


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("case", G.TRANSPOSE_GRID, ids=lambda c: f"{len(c[0])}d-{sorted(c[4])}")
def test_conv_transpose_matches_cpu(case, dt):
    sp, kernel, strides, dil, extra, group, (c, mg) = case
    dtype = DTYPES[dt]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, c, *sp)).astype(dtype)
    inits = {"w": _weights(rng, (c, mg, *kernel), dtype, c // group * int(np.prod(kernel)))}
    inits["b"] = rng.standard_normal(mg * group).astype(dtype)
    attrs = G.transpose_attrs(None, None, kernel, strides, dil, extra, group)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    _compare(_model([node], x.shape, dtype, inits), x)


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("case", G.POOL_GRID, ids=lambda c: f"{c[0]}-{len(c[1])}d-{c[4]}-c{c[5]}")
def test_pools_match_cpu(case, dt):
    kind, sp, kernel, strides, pads, ceil, include = case
    dtype = DTYPES[dt]
    x = np.random.default_rng(2).standard_normal((2, 3, *sp)).astype(dtype)
    attrs = G.pool_attrs(kernel, strides, pads, ceil, include, kind)
    op = "MaxPool" if kind == "max" else "AveragePool"
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    # Cases the plan refuses run the generic pool kernel: elementwise CuPy with its count
    # map uploaded on the first run, so no seam either (at 0271156 it uploaded every run
    # and its capture failed for ceil_mode and asymmetric excluded pads).
    _compare(_model([node], x.shape, dtype, {}), x)


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("sp", [(7,), (5, 6), (3, 4, 2), (20, 20)])
def test_global_pools_match_cpu(op, sp, dt):
    dtype = DTYPES[dt]
    x = np.random.default_rng(3).standard_normal((2, 3, *sp)).astype(dtype)
    _compare(_model([helper.make_node(op, ["x"], ["y"])], x.shape, dtype, {}), x)


@pytest.mark.parametrize("dt", list(DTYPES))
@pytest.mark.parametrize(
    ("act", "bounds"), [("Relu", None), ("Clip", (0.0, 6.0)), ("Clip", (-1.0, 1.0))]
)
def test_conv_activation_fuses_and_matches_cpu(act, bounds, dt):
    dtype = DTYPES[dt]
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 4, 9, 8)).astype(dtype)
    inits = {"w": _weights(rng, (6, 2, 3, 3), dtype, 18), "b": rng.standard_normal(6).astype(dtype)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=2, pads=[1, 0, 1, 2])]
    if act == "Relu":
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    else:
        inits["lo"] = np.array(bounds[0], dtype)
        inits["hi"] = np.array(bounds[1], dtype)
        nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["y"]))
    sess = _compare(_model(nodes, x.shape, dtype, inits), x)
    assert [n.op_type for n in sess.placement().nodes] == ["FusedConv"]


def _small_cnn(dtype, rng):
    """Conv-Relu, MaxPool, a residual block, a strided conv, GAP, a classifier."""
    w = {
        "w1": _weights(rng, (8, 3, 3, 3), dtype, 27),
        "b1": rng.standard_normal(8).astype(dtype),
        "w2": _weights(rng, (8, 8, 3, 3), dtype, 72),
        "w3": _weights(rng, (8, 8, 3, 3), dtype, 72),
        "w4": _weights(rng, (16, 8, 3, 3), dtype, 72),
        "b4": rng.standard_normal(16).astype(dtype),
        "fc": _weights(rng, (16, 10), dtype, 16),
        "shape": np.array([0, -1], np.int64),
    }
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        n("Relu", ["c1"], ["r1"]),
        n("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        n("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        n("Relu", ["c2"], ["r2"]),
        n("Conv", ["r2", "w3"], ["c3"], pads=[1, 1, 1, 1]),
        n("Add", ["c3", "p1"], ["s"]),
        n("Relu", ["s"], ["r3"]),
        n("Conv", ["r3", "w4", "b4"], ["c4"], strides=[2, 2], auto_pad="SAME_UPPER"),
        n("GlobalAveragePool", ["c4"], ["g"]),
        n("Reshape", ["g", "shape"], ["f"]),
        n("MatMul", ["f", "fc"], ["y"]),
    ]
    return nodes, w


@pytest.mark.parametrize("dt", list(DTYPES))
def test_a_small_cnn_is_captured_whole(dt):
    dtype = DTYPES[dt]
    rng = np.random.default_rng(5)
    nodes, inits = _small_cnn(dtype, rng)
    x = rng.standard_normal((2, 3, 16, 16)).astype(dtype)
    sess = _compare(_model(nodes, x.shape, dtype, inits), x)
    plan = sess.capture_plan()
    assert plan.mode == "whole" and not plan.seams, plan.format()
    s = sess.capture_stats()
    assert s["captures"] == 1 and s["replays"] >= 1 and s["fallbacks"] == 0, s


def test_a_case_cudnn_cannot_take_says_so():
    # Four spatial dims: no cuDNN descriptor; the generic kernel runs it, not captured.
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 2, 3, 4, 3, 4)).astype(np.float32)
    inits = {"w": _weights(rng, (3, 2, 2, 2, 2, 2), np.float32, 32)}
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv4d")
    sess = _compare(_model([node], x.shape, np.float32, inits), x, seams_ok=True)
    reasons = [r.reason for r in sess.capture_plan().seams if r.name == "conv4d"]
    assert reasons and "4 spatial dims" in reasons[0] and "cuBLAS" in reasons[0], reasons


def test_the_provider_line_names_cudnn():
    from onnxep.providers_cuda.plugin import plugin

    line = plugin.onnxep_provider_info().description
    assert "cuDNN" in line and "for Conv" in line, line


def test_use_tf32_lets_float32_run_on_tensor_cores_and_stays_close():
    """``use_tf32=1`` (onnxruntime's option): float32 products may round to TF32. The
    GEMM then differs from the exact run by TF32's rounding, never by more than its
    tolerance; a CNN stays within 1e-2 of the CPU provider and is still one graph."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((256, 512)).astype(np.float32)
    b = helper.make_node("MatMul", ["x", "w"], ["y"])
    mm = _model([b], a.shape, np.float32, {"w": rng.standard_normal((512, 256), np.float32)})
    exact = onnxep.InferenceSession(mm, providers=["cuda"]).run(None, {"x": a})[0]
    tf32 = onnxep.InferenceSession(mm, providers=[("cuda", {"use_tf32": 1})])
    fast = tf32.run(None, {"x": a})[0]
    err = np.abs(fast - exact).max() / np.abs(exact).max()
    assert 1e-6 < err < 1e-2, err  # TF32 keeps 10 mantissa bits: visible, and bounded

    nodes, inits = _small_cnn(np.float32, rng)
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    model = _model(nodes, x.shape, np.float32, inits)
    (want,) = onnxep.InferenceSession(model, providers=["cpu"]).run(None, {"x": x})
    sess = onnxep.InferenceSession(model, providers=[("cuda", {"use_tf32": "1"})])
    for _ in range(4):
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-2, atol=1e-2)
    assert sess.capture_stats()["captures"] == 1, sess.capture_stats()
