"""The CPU provider's nearest-neighbour Resize (``providers_cpu/ops/op_resize.py``).

The compiled pass against the generic kernel bit for bit (every output element is an
input element) and against onnx.reference and onnxruntime, over scales up and down,
sizes, the coordinate modes and rounding rules, the axes attribute, other ranks and
dtypes; and that it runs where it should (spied) and not where it should not.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxep
from onnxep.providers_cpu import jit

ort = pytest.importorskip("onnxruntime")
needs_jit = pytest.mark.skipif(not jit.ENABLED, reason="numba not installed")

F32, F64, I64 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64


def _model(shape, elem=F32, scales=None, sizes=None, opset=19, **attrs):
    inits, ins = [], ["x", ""]
    if scales is not None:
        inits.append(numpy_helper.from_array(np.asarray(scales, np.float32), "scales"))
        ins.append("scales")
    else:
        ins.append("")
        inits.append(numpy_helper.from_array(np.asarray(sizes, np.int64), "sizes"))
        ins.append("sizes")
    node = helper.make_node("Resize", ins, ["y"], mode="nearest", **attrs)
    graph = helper.make_graph(
        [node],
        "r",
        [helper.make_tensor_value_info("x", elem, list(shape))],
        [helper.make_tensor_value_info("y", elem, None)],
        inits,
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m.SerializeToString()


def _data(shape, elem, seed=0):
    rng = np.random.default_rng(seed)
    if elem == I64:
        return rng.integers(-50, 50, shape).astype(np.int64)
    x = rng.standard_normal(shape).astype(np.float64 if elem == F64 else np.float32)
    flat = x.reshape(-1)
    flat[: min(3, flat.size)] = [np.nan, np.inf, -0.0][: flat.size]  # copied as they are
    return x


def _spy(monkeypatch) -> list:
    calls: list = []
    real = jit.loop

    def loop(name):
        f = real(name)
        if name != "nearest_2d":
            return f
        return lambda *a: calls.append(a[0].shape) or f(*a)

    monkeypatch.setattr(jit, "loop", loop)
    return calls


CASES = {
    "2x, asymmetric floor (a detection neck)": dict(
        shape=(1, 96, 8, 12),
        scales=[1, 1, 2, 2],
        coordinate_transformation_mode="asymmetric",
        nearest_mode="floor",
    ),
    "8x from 2x3": dict(
        shape=(1, 24, 2, 3),
        scales=[1, 1, 8, 8],
        coordinate_transformation_mode="asymmetric",
        nearest_mode="floor",
    ),
    "half_pixel, round_prefer_floor, 1.5x and 0.6x": dict(
        shape=(2, 3, 7, 10), scales=[1, 1, 1.5, 0.6]
    ),
    "down 0.5, align_corners, ceil": dict(
        shape=(1, 4, 9, 11),
        scales=[1, 1, 0.5, 0.5],
        coordinate_transformation_mode="align_corners",
        nearest_mode="ceil",
    ),
    "sizes, pytorch_half_pixel, round_prefer_ceil": dict(
        shape=(1, 5, 6, 7),
        sizes=[1, 5, 13, 4],
        coordinate_transformation_mode="pytorch_half_pixel",
        nearest_mode="round_prefer_ceil",
    ),
    "width only": dict(shape=(1, 3, 5, 6), scales=[1, 1, 1, 3]),
    "height only, axes attribute": dict(shape=(2, 3, 5, 6), scales=[2.0], axes=[2]),
    "3-D input (a 1-D signal) upsampled": dict(shape=(2, 4, 9), scales=[1, 1, 2]),
    "5-D input, last two axes": dict(shape=(1, 2, 3, 4, 5), scales=[1, 1, 1, 2, 2]),
    "float64": dict(shape=(1, 3, 4, 5), scales=[1, 1, 2, 3], elem=F64),
    # 2x widths: j // 2 takes the two-store loop (odd width, float64), round_prefer_ceil's
    # map (1, 1, 2, 2, ...) is not j // 2 and keeps the gather
    "2x odd width, half_pixel": dict(shape=(1, 5, 3, 7), scales=[1, 1, 2, 2]),
    "2x float64": dict(shape=(2, 3, 4, 9), scales=[1, 1, 2, 2], elem=F64),
    "2x asymmetric round_prefer_ceil": dict(
        shape=(1, 4, 5, 6),
        scales=[1, 1, 2, 2],
        coordinate_transformation_mode="asymmetric",
        nearest_mode="round_prefer_ceil",
    ),
}


@needs_jit
@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_nearest_matches_the_generic_kernel_and_onnxruntime(case, monkeypatch):
    kw = dict(CASES[case])
    shape, elem = kw.pop("shape"), kw.pop("elem", F32)
    model = _model(shape, elem, **kw)
    x = _data(shape, elem)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    first = sess.run(None, {"x": x})[0]  # the generic kernel: a new shape's first run
    calls = _spy(monkeypatch)
    got = sess.run(None, {"x": x})[0]
    assert calls, "the compiled pass did not run"
    assert got.dtype == first.dtype and got.shape == first.shape
    np.testing.assert_array_equal(got.view(np.uint8), first.view(np.uint8))
    monkeypatch.setattr(jit, "ENABLED", False)
    plain = onnxep.InferenceSession(model, providers=["cpu"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got.view(np.uint8), plain.view(np.uint8))
    # onnx.reference, not onnxruntime: onnxruntime has no float64 Resize, and rounds
    # align_corners' downscaled coordinates another way (onnxep's generic kernel is the
    # reference (it multiplies by one-hot weights, so an infinity becomes NaN: finite data)
    finite = np.where(np.isfinite(x), x, 0).astype(x.dtype)
    monkeypatch.setattr(jit, "ENABLED", True)
    got = sess.run(None, {"x": finite})[0]
    want = ReferenceEvaluator(onnx.load_from_string(model)).run(None, {"x": finite})[0]
    np.testing.assert_array_equal(got, want)


@needs_jit
def test_other_shapes_on_later_runs_and_what_stays_generic(monkeypatch):
    model = _model((1, 2, None, None), scales=[1, 1, 2, 2])
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    calls = _spy(monkeypatch)
    for hw in [(3, 4), (5, 2), (3, 4), (1, 1)]:
        x = _data((1, 2, *hw), F32, seed=hw[0])
        for _ in range(2):
            got = sess.run(None, {"x": x})[0]
            np.testing.assert_array_equal(got, x.repeat(2, axis=2).repeat(2, axis=3))
    assert len(calls) == 5  # every run but a new shape's first (the generic kernel's)
    calls.clear()
    # integers, an axis other than the last two, an empty input: the generic kernel
    for model, x in [
        (_model((1, 2, 3, 4), I64, scales=[1, 1, 2, 2]), _data((1, 2, 3, 4), I64)),
        (_model((1, 2, 3, 4), scales=[1, 2, 2, 2]), _data((1, 2, 3, 4), F32)),
        (_model((1, 0, 3, 4), scales=[1, 1, 2, 2]), np.zeros((1, 0, 3, 4), np.float32)),
    ]:
        sess = onnxep.InferenceSession(model, providers=["cpu"])
        for _ in range(2):
            got = sess.run(None, {"x": x})[0]
        x = np.where(np.isfinite(x), x, 0).astype(x.dtype)
        got = sess.run(None, {"x": x})[0]
        want = ReferenceEvaluator(onnx.load_from_string(model)).run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, want)
    assert not calls


def test_without_numba_the_generic_kernel_runs(monkeypatch):
    monkeypatch.setattr(jit, "ENABLED", False)
    model = _model((1, 3, 4, 5), scales=[1, 1, 2, 2])
    x = _data((1, 3, 4, 5), F32)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    for _ in range(3):
        got = sess.run(None, {"x": x})[0]
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)


@needs_jit
@pytest.mark.parametrize(
    "mode,nearest,want",
    [
        ("asymmetric", "floor", True),
        ("half_pixel", "round_prefer_floor", True),
        ("asymmetric", "round_prefer_ceil", False),
    ],
)
def test_the_two_store_loop_runs_where_columns_are_j_over_2(mode, nearest, want, monkeypatch):
    """A 2x width whose column map is j // 2 runs the two-store loop (``doubled``), any other
    map the gather; both give the generic kernel's bits."""
    shape = (1, 3, 4, 10)
    model = _model(
        shape, F32, scales=[1, 1, 2, 2], coordinate_transformation_mode=mode, nearest_mode=nearest
    )
    x = _data(shape, F32)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    first = sess.run(None, {"x": x})[0]
    seen: list = []
    real = jit.loop

    def loop(name):
        f = real(name)
        if name != "nearest_2d":
            return f
        return lambda *a: seen.append(a[3]) or f(*a)

    monkeypatch.setattr(jit, "loop", loop)
    got = sess.run(None, {"x": x})[0]
    assert seen == [want]
    assert got.tobytes() == first.tobytes()
