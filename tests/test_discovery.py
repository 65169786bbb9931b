"""Providers found through entry points of installed distributions, and broken ones reported."""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest

import onnxep
from onnxep.errors import ProviderError


def test_builtin_providers_come_from_entry_points():
    names = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="onnxep.providers")}
    assert names["cpu"] == "onnxep.providers_cpu.plugin:plugin"
    assert "cpu" in onnxep.get_available_providers()
    statuses = {s.name: s for s in onnxep.get_all_providers()}
    assert statuses["cpu"].source == "onnxep.providers_cpu.plugin:plugin"


def test_cuda_without_cupy_is_listed_with_reason():
    statuses = {s.name: s for s in onnxep.get_all_providers()}
    cuda = statuses["cuda"]
    if cuda.available:
        pytest.skip("a usable CUDA provider is present")
    assert cuda.reason
    assert "cuda" not in onnxep.get_available_providers()


def test_asking_for_unavailable_cuda_by_name_is_clear(add_relu_model):
    statuses = {s.name: s for s in onnxep.get_all_providers()}
    if statuses["cuda"].available:
        pytest.skip("a usable CUDA provider is present")
    with pytest.raises(ProviderError, match="'cuda' is not available here"):
        onnxep.InferenceSession(add_relu_model.SerializeToString(), providers=["cuda", "cpu"])


def test_distribution_provider_is_discovered(toy_dist):
    eps = {ep.name for ep in importlib.metadata.entry_points(group="onnxep.providers")}
    assert {"toy", "broken"} <= eps
    statuses = {s.name: s for s in onnxep.get_all_providers()}
    assert statuses["toy"].available
    assert statuses["toy"].source == "onnxep_toy:plugin"
    # unlisted in plugins.toml: goes after the listed ones but before cpu
    avail = onnxep.get_available_providers()
    assert avail.index("toy") < avail.index("cpu")


def test_broken_plugin_is_reported_and_skipped(toy_dist, add_relu_model):
    failures = onnxep.plugin_failures()
    broken = [f for f in failures if f.name == "broken"]
    assert broken and "libfoo" in broken[0].error
    assert broken[0].entry_point == "onnxep_broken:plugin"
    assert "broken" not in onnxep.get_available_providers()
    with pytest.raises(ProviderError, match="'broken' could not be loaded.*libfoo"):
        onnxep.InferenceSession(add_relu_model, providers=["broken"])


def test_unknown_provider_lists_what_exists(add_relu_model):
    with pytest.raises(ProviderError, match="unknown provider 'tpu'.*discovered providers: .*cpu"):
        onnxep.InferenceSession(add_relu_model, providers=["tpu"])


def test_register_provider_at_run_time(add_relu_model):
    from onnxep.providers import Provider, ProviderInfo, hookimpl, kernel

    @kernel("Relu", since=6)
    def relu(node, xp):
        return lambda x: (xp.maximum(x, 0) * 1,)

    class Plugin:
        @hookimpl
        def onnxep_provider_info(self):
            return ProviderInfo(name="runtime_toy", device="cpu")

        @hookimpl
        def onnxep_create_provider(self, options):
            return Provider("runtime_toy", options)

        @hookimpl
        def onnxep_kernels(self, provider):
            return relu.__onnxep_kernels__ if provider.name == "runtime_toy" else None

    plugin = Plugin()
    onnxep.register_provider(plugin)
    try:
        sess = onnxep.InferenceSession(add_relu_model, providers=["runtime_toy", "cpu"])
        rep = sess.placement()
        assert rep["relu"].provider == "runtime_toy"
        assert rep["add"].provider == "cpu"
        x = np.ones((2, 4), np.float32)
        (out,) = sess.run(None, {"x": x, "y": -3 * x})
        np.testing.assert_allclose(out, np.full((2, 4), 0.25, np.float32))
    finally:
        from onnxep.providers.discovery import unregister_plugin

        unregister_plugin(plugin)


def test_hook_that_raises_is_reported(add_relu_model):
    from onnxep.providers import ProviderInfo, hookimpl

    class Plugin:
        @hookimpl
        def onnxep_provider_info(self):
            return ProviderInfo(name="raising", device="cpu")

        @hookimpl
        def onnxep_create_provider(self, options):
            raise RuntimeError("device lost")

    plugin = Plugin()
    onnxep.register_provider(plugin, name="raising-plugin")
    try:
        with pytest.raises(ProviderError, match="'raising' failed to start.*device lost"):
            onnxep.InferenceSession(add_relu_model, providers=["raising"])
        sess = onnxep.InferenceSession(add_relu_model, providers=["cpu"])
        assert sess.get_providers() == ["cpu"]
        assert any(f.hook == "onnxep_create_provider" for f in onnxep.plugin_failures())
    finally:
        from onnxep.providers.discovery import unregister_plugin

        unregister_plugin(plugin)
