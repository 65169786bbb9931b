"""Starting one provider: its plugin creates it, every plugin adds kernels, its plugin adds passes.

The provider's own plugin is called first for each hook. When one of its
hooks raises, :class:`OwnHookRaised` carries the hook and the exception to
the host, which decides what that means (the provider is broken). Another
plugin raising while adding kernels to the provider is that plugin's failure:
it is recorded, and noted in the registry so "no kernel" declines can say
which kernels are missing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from onnxep.providers.kernel import KernelSpec
from onnxep.providers.provider import Provider
from onnxep.providers.registry import KernelConflict, KernelShadowed

from .failures import PluginFailure

if TYPE_CHECKING:
    from .host import DiscoveredProvider, PluginHost


class ProviderStartError(RuntimeError):
    """A provider's own plugin failed while starting it; ``__cause__`` is what it raised."""

    def __init__(self, provider: str, reason: str) -> None:
        super().__init__(reason)
        self.provider = provider
        self.reason = reason


class OwnHookRaised(Exception):
    """One of the provider's own plugin's hooks raised ``error`` (or returned nonsense)."""

    def __init__(self, hook: str, error: BaseException) -> None:
        super().__init__(hook)
        self.hook = hook
        self.error = error


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _invoke(impl: Any, kwargs: dict[str, Any]) -> Any:
    return impl.function(*[kwargs[a] for a in impl.argnames])


def start_provider(
    host: PluginHost, dp: DiscoveredProvider, options: dict[str, Any]
) -> tuple[Provider, list[Any]]:
    """The new provider and its own plugin's ``extended`` passes; raises OwnHookRaised."""
    provider = _instantiate(host, dp, options)
    _add_all_kernels(host, dp, provider)
    return provider, _own_rewrites(host, dp, provider)


def _instantiate(host: PluginHost, dp: DiscoveredProvider, options: dict[str, Any]) -> Provider:
    hook = "onnxep_create_provider"
    made = None
    for impl in host.impls(hook, dp.plugin_name):
        try:
            made = _invoke(impl, {"options": options})
        except Exception as exc:
            raise OwnHookRaised(hook, exc) from exc
        if made is not None:
            break
    if not isinstance(made, Provider):
        got = "nothing" if made is None else type(made).__name__
        raise OwnHookRaised(hook, TypeError(f"returned {got}, expected a Provider"))
    if made.name != dp.name:
        why = f"returned a provider named {made.name!r} for provider {dp.name!r}"
        raise OwnHookRaised(hook, ValueError(why))
    return made


def _add_all_kernels(host: PluginHost, dp: DiscoveredProvider, provider: Provider) -> None:
    hook = "onnxep_kernels"
    impls = host.impls(hook)
    impls.sort(key=lambda i: i.plugin_name != dp.plugin_name)
    for impl in impls:
        try:
            specs = _invoke(impl, {"provider": provider})
            if specs is not None:
                _add_kernels(host, provider, impl.plugin_name, specs)
        except Exception as exc:
            if impl.plugin_name == dp.plugin_name:
                raise OwnHookRaised(hook, exc) from exc
            host.record(
                PluginFailure(
                    impl.plugin_name,
                    host.source_of(impl.plugin_name),
                    describe(exc),
                    hook,
                    provider=dp.name,
                )
            )
            provider.registry.missing.append(
                f"plugin {impl.plugin_name!r} failed to add its kernels: {describe(exc)}"
            )
            continue
        provider.registry.check_shadowed(impl.plugin_name)


def _add_kernels(host: PluginHost, provider: Provider, plugin: str, specs: Iterable[Any]) -> None:
    for module, error in getattr(specs, "failures", ()):
        # One op module that fails to import is that module's failure, not the provider's.
        host.record(
            PluginFailure(
                plugin,
                host.source_of(plugin),
                f"kernel module {module}: {error}",
                "onnxep_kernels",
                provider=provider.name,
            )
        )
    for spec in specs:
        if not isinstance(spec, KernelSpec):
            raise TypeError(f"returned a {type(spec).__name__} among its kernels, not a KernelSpec")
        provider.registry.add(spec, source=plugin)


def _own_rewrites(host: PluginHost, dp: DiscoveredProvider, provider: Provider) -> list[Any]:
    hook = "onnxep_graph_rewrites"
    passes: list[Any] = []
    for impl in host.impls(hook, dp.plugin_name):
        try:
            passes.extend(_invoke(impl, {"provider": provider, "level": "extended"}) or ())
        except Exception as exc:
            raise OwnHookRaised(hook, exc) from exc
    return passes


def refusals(provider: Provider) -> list[KernelConflict | KernelShadowed]:
    """The provider's kernel registrations that were refused or are shadowed."""
    return [*provider.registry.conflicts, *provider.registry.shadowed]
