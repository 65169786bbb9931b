"""The CPU Tanh (``providers_cpu/ops/tanh.py``, ``op_tanh.py``): float32 through the compiled
``tanh32`` (no libm call per value), its error over the float32 range against float64
tanh, special values (NaN, infinities, signed zeros, tiny and large |x|), shapes (empty,
0-d, strided, in place), other dtypes and numba off on NumPy's ufunc, against
onnx.reference and onnxruntime; FusedConv's Tanh the unfused nodes' bits."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import onnxep
from onnxep.providers_cpu import jit
from onnxep.providers_cpu.ops import tanh as th

H = helper.make_node
ELEM = {
    np.float32: TensorProto.FLOAT,
    np.float64: TensorProto.DOUBLE,
    np.float16: TensorProto.FLOAT16,
}
# tanh32's bound against float64 tanh (docs/cpu_kernels.md, "Compiled recurrences"):
# 3.0e-7 relative measured; MLAS's approximation in onnxruntime 3.2e-7.
REL_TOL = 3.1e-7

needs_numba = pytest.mark.skipif(not jit.ENABLED, reason="numba not installed")


def _model(dtype=np.float32, shape=None, opset=13):
    m = make_model(
        [H("Tanh", ["x"], ["y"])],
        [tensor("x", shape, ELEM[dtype])],
        [tensor("y", None, ELEM[dtype])],
        opset=opset,
    )
    return m


def _run(x, opset=13):
    model = _model(x.dtype.type, list(x.shape), opset)
    return onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"]).run(
        None, {"x": x}
    )[0]


def _sweep(step: int = 397) -> np.ndarray:
    bits = np.arange(0, 1 << 32, step, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    return x[~np.isnan(x)]


@needs_numba
def test_error_over_the_float32_range():
    x = _sweep()
    got = th.tanh(x)
    want = np.tanh(x.astype(np.float64))
    err = np.abs(got - want)
    tiny = np.finfo(np.float32).tiny
    rel = err / np.maximum(np.abs(want), tiny)
    assert rel.max() <= REL_TOL, (x[rel.argmax()], rel.max())
    assert np.abs(got).max() <= 1


@needs_numba
def test_special_values():
    x = np.array(
        [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-38, 1e-20, 9.0, 9.5, -30, 88, 1e30],
        np.float32,
    )
    got = _run(x)
    assert np.isnan(got[0])
    assert list(got[1:3]) == [1.0, -1.0]
    assert got[3] == 0 and not np.signbit(got[3])
    assert got[4] == 0 and np.signbit(got[4])
    # tanh(x) rounds to x for tiny x
    assert list(got[5:8]) == list(x[5:8])
    assert list(got[8:]) == pytest.approx(list(np.tanh(x[8:].astype(np.float64))), rel=REL_TOL)


@needs_numba
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5), (2, 3, 64), (1, 4096), (3, 17, 33)])
def test_against_onnx_reference_and_onnxruntime(shape):
    x = (np.random.default_rng(sum(shape)).standard_normal(shape) * 4).astype(np.float32)
    got = _run(x)
    model = _model(np.float32, list(shape))
    (ref,) = ReferenceEvaluator(model).run(None, {"x": x})
    (peer,) = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, {"x": x})
    assert got.shape == ref.shape and got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=REL_TOL, atol=1e-30)
    np.testing.assert_allclose(got, peer, rtol=1e-6, atol=1e-7)


@needs_numba
def test_shapes_empty_zero_d_strided_and_in_place():
    assert _run(np.zeros((0, 3), np.float32)).shape == (0, 3)
    x0 = np.array(0.5, np.float32)
    got = _run(x0)
    assert got.shape == () and got == pytest.approx(np.tanh(0.5), rel=REL_TOL)
    base = (np.random.default_rng(2).standard_normal((6, 10)) * 3).astype(np.float32)
    view = base[::2, 1::3]
    assert not view.flags.c_contiguous
    flat = th.tanh(np.ascontiguousarray(view))
    assert th.tanh(view).tobytes() == flat.tobytes()
    out = np.empty((10, 6), np.float32).T[:3, :3]  # a strided out
    th.tanh(view, out=out)
    assert out.tobytes() == flat.tobytes()
    y = base.copy()
    assert th.tanh(y, out=y) is y
    assert y.tobytes() == th.tanh(base).tobytes()


@pytest.mark.parametrize("dtype", [np.float64, np.float16])
def test_other_dtypes_keep_numpy(dtype):
    x = (np.random.default_rng(3).standard_normal((4, 9)) * 3).astype(dtype)
    got = _run(x)
    assert got.dtype == dtype and got.tobytes() == np.tanh(x).tobytes()


def test_numba_off_keeps_numpy(monkeypatch):
    monkeypatch.setattr(jit, "ENABLED", False)
    x = (np.random.default_rng(4).standard_normal((5, 300)) * 3).astype(np.float32)
    assert not th.compiled(x.dtype)
    assert th.tanh(x).tobytes() == np.tanh(x).tobytes()
    assert _run(x).tobytes() == np.tanh(x).tobytes()


@pytest.mark.parametrize("opset", [6, 13])
def test_opsets(opset):
    x = np.linspace(-5, 5, 101, dtype=np.float32)
    np.testing.assert_allclose(_run(x, opset), np.tanh(x.astype(np.float64)), rtol=REL_TOL)


# (in channels, out channels, kernel, group, stride): dense 3x3, depthwise stride 2
CONVS = [(4, 6, 3, 1, 1), (6, 6, 3, 6, 2)]


def _conv(cin, cout, ks, group, stride, fused):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((cout, cin // group, ks, ks)) * 0.5).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    geo = dict(group=group, strides=[stride] * 2, pads=[ks // 2] * 4)
    if fused:
        nodes = [H("FusedConv", ["x", "w", "b"], ["y"], domain="com.microsoft",
                   activation="Tanh", **geo)]  # fmt: skip
        extra = [("com.microsoft", 1)]
    else:
        nodes = [H("Conv", ["x", "w", "b"], ["c"], **geo), H("Tanh", ["c"], ["y"])]
        extra = []
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    m = make_model(
        nodes, [tensor("x", [2, cin, 9, 11])], [tensor("y", None)], inits, extra_opsets=extra
    )
    so = onnxep.SessionOptions(disabled_rewrites=["fuse_conv_activation"])
    return m.SerializeToString(), onnxep.InferenceSession(m.SerializeToString(), so,
                                                          providers=["cpu"])  # fmt: skip


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
@pytest.mark.parametrize("conv", CONVS, ids=["dense", "depthwise"])
def test_fused_conv_tanh_equals_unfused(conv, compiled, monkeypatch):
    if compiled and not jit.ENABLED:
        pytest.skip("numba not installed")
    monkeypatch.setattr(jit, "ENABLED", compiled)
    model, fused = _conv(*conv, fused=True)
    _, plain = _conv(*conv, fused=False)
    assert [n.op_type for n in fused.placement().nodes] == ["FusedConv"]
    x = (np.random.default_rng(1).standard_normal((2, conv[0], 9, 11)) * 3).astype(np.float32)
    got, want = fused.run(None, {"x": x})[0], plain.run(None, {"x": x})[0]
    assert got.tobytes() == want.tobytes()
    peer = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, peer, rtol=1e-5, atol=1e-6)
