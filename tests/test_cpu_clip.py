"""The CPU provider's Clip (providers_cpu/ops/op_clip.py): one np.clip pass with scalar
bounds, against onnxruntime and the generic kernel."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper, numpy_helper

import onnxep
from onnxep.providers_cpu.ops import op_clip

ELEM = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE}


def _inputs_model(dtype, lo, hi, const=True, opset=13):
    """Clip(x, lo, hi) with bounds as constants (None: omitted) or as graph inputs."""
    elem = ELEM[dtype]
    names, inits, inputs = ["x"], [], [tensor("x", None, elem)]
    for name, v in (("lo", lo), ("hi", hi)):
        if v is None:
            names.append("")
        elif const:
            names.append(name)
            inits.append(numpy_helper.from_array(np.array(v, dtype), name))
        else:
            names.append(name)
            inputs.append(tensor(name, [], elem))
    while names[-1] == "":
        names.pop()
    node = helper.make_node("Clip", names, ["y"])
    return make_model([node], inputs, [tensor("y", None, elem)], inits, opset=opset)


def _x(dtype, shape=(2, 5, 7, 3)):
    x = np.asarray(np.random.default_rng(0).standard_normal(shape) * 4, dtype)
    x.flat[:6] = [0, 6, -np.inf, np.inf, np.nan, 3]
    return x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bounds", [(0, 6), (None, 2.5), (-1.5, None), (None, None), (3, -1)])
def test_constant_bounds_match_onnxruntime_and_the_generic_kernel(dtype, bounds, monkeypatch):
    model = _inputs_model(dtype, *bounds)
    x = _x(dtype)
    got = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    for _ in range(2):
        y = got.run(None, {"x": x})[0]
    assert y.dtype == dtype and y.shape == x.shape
    if dtype == np.float32:
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        ref = want.run(None, {"x": x})[0]
        # onnxruntime's missing bound is the lowest/highest float (the spec's default), the
        # generic kernel's none at all: they differ on infinite inputs only
        keep = np.isfinite(x) | (np.array(bounds) != None).all()  # noqa: E711
        np.testing.assert_array_equal(y[keep], ref[keep])
    # the generic kernel's maximum/minimum: equal values (it makes -0.0 a +0.0)
    calls = []
    real = op_clip._clip  # noqa: SLF001  (a spy on the fast path)
    monkeypatch.setattr(op_clip, "_clip", lambda *a: calls.append(a) or real(*a))
    onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"]).run(None, {"x": x})
    assert calls, "the fast path did not run"
    monkeypatch.setattr(op_clip, "_FAST", ())
    plain = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    np.testing.assert_array_equal(y, plain.run(None, {"x": x})[0])


def test_bounds_as_graph_inputs():
    model = _inputs_model(np.float32, 0, 6, const=False).SerializeToString()
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    x = _x(np.float32)
    for lo, hi in ((0, 6), (-2, 1), (2, -1)):
        f = {"x": x, "lo": np.array(lo, np.float32), "hi": np.array(hi, np.float32)}
        np.testing.assert_array_equal(sess.run(None, f)[0], ref.run(None, f)[0])
    # a NaN bound goes to the generic kernel (maximum with NaN is NaN; onnxruntime ignores it)
    f = {"x": x, "lo": np.array(np.nan, np.float32), "hi": np.array(1, np.float32)}
    assert np.isnan(sess.run(None, f)[0]).all()


def test_attribute_form_opset_6():
    node = helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=0.75)
    model = make_model([node], [tensor("x", None)], [tensor("y", None)], opset=6)
    x = _x(np.float32)
    got = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"]).run(None, {"x": x})
    np.testing.assert_array_equal(got[0], np.clip(x, np.float32(-0.5), np.float32(0.75)))


@pytest.mark.parametrize("shape", [[], [0, 3]])
def test_empty_and_scalar_inputs(shape):
    model = _inputs_model(np.float32, 0, 6).SerializeToString()
    x = np.asarray(np.full(shape, 7.5), np.float32)
    y = onnxep.InferenceSession(model, providers=["cpu"]).run(None, {"x": x})[0]
    assert y.shape == x.shape and isinstance(y, np.ndarray)
    np.testing.assert_array_equal(y, np.minimum(x, 6))


def test_integers_take_the_generic_kernel():
    node = helper.make_node("Clip", ["x", "lo", "hi"], ["y"])
    inits = [
        numpy_helper.from_array(np.array(-3, np.int32), "lo"),
        numpy_helper.from_array(np.array(4, np.int32), "hi"),
    ]
    model = make_model(
        [node],
        [tensor("x", None, TensorProto.INT32)],
        [tensor("y", None, TensorProto.INT32)],
        inits,
    )
    x = np.arange(-6, 7, dtype=np.int32)
    y = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"]).run(None, {"x": x})[0]
    assert y.dtype == np.int32
    np.testing.assert_array_equal(y, np.clip(x, -3, 4))
