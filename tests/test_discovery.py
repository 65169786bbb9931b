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


@pytest.mark.parametrize(
    "listed", [["cuda", "cpu"], ["CUDAExecutionProvider", "CPUExecutionProvider"], ["cuda"]]
)
def test_unavailable_cuda_in_a_list_is_skipped_with_one_warning(add_relu_model, listed):
    """As onnxruntime does: one script serves a laptop and a GPU server."""
    statuses = {s.name: s for s in onnxep.get_all_providers()}
    if statuses["cuda"].available:
        pytest.skip("a usable CUDA provider is present")
    with pytest.warns(UserWarning, match="provider 'cuda' is skipped: is not available here") as w:
        sess = onnxep.InferenceSession(add_relu_model.SerializeToString(), providers=listed)
    assert len([x for x in w if "skipped" in str(x.message)]) == 1
    assert sess.get_providers() == ["cpu"]
    assert statuses["cuda"].reason in str(w[0].message)


def test_unavailable_cuda_is_an_error_when_fallback_is_disabled(add_relu_model):
    statuses = {s.name: s for s in onnxep.get_all_providers()}
    if statuses["cuda"].available:
        pytest.skip("a usable CUDA provider is present")
    strict = onnxep.SessionOptions(disable_fallback=True)
    with pytest.raises(ProviderError, match="'cuda' is not available here"):
        onnxep.InferenceSession(
            add_relu_model.SerializeToString(), strict, providers=["cuda", "cpu"]
        )


def test_an_onnxruntime_provider_this_install_lacks_is_skipped(add_relu_model):
    with pytest.warns(UserWarning, match="'TensorrtExecutionProvider' is skipped"):
        sess = onnxep.InferenceSession(
            add_relu_model.SerializeToString(),
            providers=["TensorrtExecutionProvider", "CPUExecutionProvider"],
        )
    assert sess.get_providers() == ["cpu"]


def test_a_misspelt_provider_stays_an_error(add_relu_model):
    with pytest.raises(ProviderError, match="unknown provider 'cdua'"):
        onnxep.InferenceSession(add_relu_model.SerializeToString(), providers=["cdua", "cpu"])


def test_cuda_install_hint_matches_how_onnxep_was_installed():
    from onnxep.providers_cuda import availability

    hint = availability.install_hint()
    if availability._checkout() is not None:  # noqa: SLF001 - the mode the hint follows
        assert 'pip install -e ".[cuda12]"' in hint
    else:
        assert 'pip install "onnxep[cuda12]"' in hint


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
    with pytest.warns(UserWarning, match="'broken' is skipped: could not be loaded.*libfoo"):
        sess = onnxep.InferenceSession(add_relu_model, providers=["broken"])
    assert sess.get_providers() == ["cpu"]
    strict = onnxep.SessionOptions(disable_fallback=True)
    with pytest.raises(ProviderError, match="'broken' could not be loaded.*libfoo"):
        onnxep.InferenceSession(add_relu_model, strict, providers=["broken"])


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
        with pytest.warns(UserWarning, match="'raising' is skipped: failed to start.*device lost"):
            onnxep.InferenceSession(add_relu_model, providers=["raising"])
        strict = onnxep.SessionOptions(disable_fallback=True)
        with pytest.raises(ProviderError, match="'raising' failed to start.*device lost"):
            onnxep.InferenceSession(add_relu_model, strict, providers=["raising"])
        sess = onnxep.InferenceSession(add_relu_model, providers=["cpu"])
        assert sess.get_providers() == ["cpu"]
        assert any(f.hook == "onnxep_create_provider" for f in onnxep.plugin_failures())
    finally:
        from onnxep.providers.discovery import unregister_plugin

        unregister_plugin(plugin)
