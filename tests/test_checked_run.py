"""The first (checked) run catches a kernel whose output has another dtype than the model says."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper

import onnxep
from onnxep.errors import RunError
from onnxep.plugins.host import unregister_plugin
from onnxep.providers import Provider, ProviderInfo, hookimpl, kernel


@kernel("Relu", since=6)
def widening_relu(node, xp):
    return lambda x: (np.maximum(x, 0).astype(np.float64),)


@kernel("Neg", since=6)
def neg(node, xp):
    return lambda x: (xp.negative(x),)


class WideningPlugin:
    @hookimpl
    def onnxep_provider_info(self):
        return ProviderInfo(name="widening", device="cpu")

    @hookimpl
    def onnxep_create_provider(self, options):
        return Provider("widening", options)

    @hookimpl
    def onnxep_kernels(self, provider):
        if provider.name == "widening":
            return [*widening_relu.__onnxep_kernels__, *neg.__onnxep_kernels__]
        return None


@pytest.fixture
def widening():
    plugin = WideningPlugin()
    onnxep.register_provider(plugin, name="widening-plugin")
    yield
    unregister_plugin(plugin)


def _model(out_type=TensorProto.FLOAT):
    return make_model(
        [
            helper.make_node("Neg", ["x"], ["n"], name="neg"),
            helper.make_node("Relu", ["n"], ["y"], name="relu"),
        ],
        [tensor("x", [3])],
        [tensor("y", [3], out_type)],
    )


def test_a_kernel_returning_float64_for_float32_is_named(widening):
    sess = onnxep.InferenceSession(_model(), providers=["widening", "cpu"])
    assert sess.placement()["relu"].provider == "widening"
    x = np.array([1, -2, 3], np.float32)
    pattern = (
        r"Relu node 'relu' on provider 'widening' returned float64 for output 0 \('y'\), "
        r"but the model's type there is float \(float32\): the kernel "
        r"\(test_checked_run\.widening_relu from plugin 'widening-plugin'\)"
    )
    with pytest.raises(RunError, match=pattern):
        sess.run(None, {"x": x})
    # Every run stays checked until one passes: the wrong dtype is never returned.
    with pytest.raises(RunError, match="returned float64"):
        sess.run(None, {"x": x})


def test_intermediate_values_are_checked_too(widening):
    m = make_model(
        [
            helper.make_node("Relu", ["x"], ["r"], name="relu"),
            helper.make_node("Neg", ["r"], ["y"], name="neg"),
        ],
        [tensor("x", [3])],
        [tensor("y", [3])],
    )
    sess = onnxep.InferenceSession(m, providers=["widening", "cpu"])
    with pytest.raises(RunError, match=r"'relu'.*float64 for output 0 \('r'\)"):
        sess.run(None, {"x": np.ones(3, np.float32)})


def test_the_right_dtype_passes_and_the_session_stays_usable(widening):
    # The same kernel is right for a float64 model; the check compares with the model's type.
    sess = onnxep.InferenceSession(
        make_model(
            [helper.make_node("Relu", ["x"], ["y"], name="relu")],
            [tensor("x", [3], TensorProto.DOUBLE)],
            [tensor("y", [3], TensorProto.DOUBLE)],
        ),
        providers=["widening", "cpu"],
    )
    x = np.array([1, -2, 3], np.float64)
    for _ in range(2):
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], [1, 0, 3])
    ref = onnxep.InferenceSession(_model(), providers=["cpu"])
    np.testing.assert_array_equal(ref.run(None, {"x": x.astype(np.float32)})[0], [0, 2, 0])


def test_profiled_runs_are_checked_too(widening, tmp_path):
    so = onnxep.SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    sess = onnxep.InferenceSession(_model(), so, providers=["widening", "cpu"])
    with pytest.raises(RunError, match="'relu' on provider 'widening' returned float64"):
        sess.run(None, {"x": np.ones(3, np.float32)})
