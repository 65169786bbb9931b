"""Starting one provider: its plugin creates it, every plugin adds kernels, its plugin adds passes.

The provider's own plugin is called first for each hook. When one of its
hooks raises, :class:`OwnHookRaised` carries the hook and the exception to
the host, which decides what that means (the provider is broken). Another
plugin raising while adding kernels to the provider is that plugin's failure:
it is returned for the host to record (on :class:`Started`, or on the
:class:`OwnHookRaised` that ended the start), and noted in the registry so
"no kernel" declines can say which kernels are missing. This module knows the
host only as the two functions it is given: the hook implementations of a
plugin, and where a plugin came from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from onnxep.providers.kernel import KernelSpec
from onnxep.providers.provider import Provider
from onnxep.providers.registry import KernelConflict, KernelShadowed

from .failures import PluginFailure

#: ``impls(hook, plugin_name)``: pluggy's implementations of ``hook`` (every plugin's
#: when ``plugin_name`` is None)
Impls = Callable[[str, str | None], list[Any]]


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
        #: other plugins' failures met before it, for the host to record
        self.failures: list[PluginFailure] = []


@dataclass
class Started:
    """A started provider, its own plugin's ``extended`` passes, other plugins' failures."""

    provider: Provider
    passes: list[Any]
    failures: list[PluginFailure] = field(default_factory=list)


@dataclass
class _Start:
    impls: Impls
    source_of: Callable[[str], str]
    name: str  # the provider's
    plugin: str  # its own plugin's
    failures: list[PluginFailure] = field(default_factory=list)


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _invoke(impl: Any, kwargs: dict[str, Any]) -> Any:
    return impl.function(*[kwargs[a] for a in impl.argnames])


def start_provider(
    impls: Impls,
    source_of: Callable[[str], str],
    name: str,
    plugin: str,
    options: dict[str, Any],
) -> Started:
    """Provider ``name`` of plugin ``plugin``, started; raises OwnHookRaised."""
    st = _Start(impls, source_of, name, plugin)
    try:
        provider = _instantiate(st, options)
        _add_all_kernels(st, provider)
        return Started(provider, _own_rewrites(st, provider), st.failures)
    except OwnHookRaised as raised:
        raised.failures = st.failures
        raise


def _instantiate(st: _Start, options: dict[str, Any]) -> Provider:
    hook = "onnxep_create_provider"
    made = None
    for impl in st.impls(hook, st.plugin):
        try:
            made = _invoke(impl, {"options": options})
        except Exception as exc:
            raise OwnHookRaised(hook, exc) from exc
        if made is not None:
            break
    if not isinstance(made, Provider):
        got = "nothing" if made is None else type(made).__name__
        raise OwnHookRaised(hook, TypeError(f"returned {got}, expected a Provider"))
    if made.name != st.name:
        why = f"returned a provider named {made.name!r} for provider {st.name!r}"
        raise OwnHookRaised(hook, ValueError(why))
    return made


def _add_all_kernels(st: _Start, provider: Provider) -> None:
    hook = "onnxep_kernels"
    impls = st.impls(hook, None)
    impls.sort(key=lambda i: i.plugin_name != st.plugin)
    for impl in impls:
        try:
            specs = _invoke(impl, {"provider": provider})
            if specs is not None:
                _add_kernels(st, provider, impl.plugin_name, specs)
        except Exception as exc:
            if impl.plugin_name == st.plugin:
                raise OwnHookRaised(hook, exc) from exc
            st.failures.append(
                PluginFailure(
                    impl.plugin_name,
                    st.source_of(impl.plugin_name),
                    describe(exc),
                    hook,
                    provider=st.name,
                )
            )
            provider.registry.missing.append(
                f"plugin {impl.plugin_name!r} failed to add its kernels: {describe(exc)}"
            )
            continue
        provider.registry.check_shadowed(impl.plugin_name)


def _add_kernels(st: _Start, provider: Provider, plugin: str, specs: Iterable[Any]) -> None:
    for module, error in getattr(specs, "failures", ()):
        # One op module that fails to import is that module's failure, not the provider's.
        st.failures.append(
            PluginFailure(
                plugin,
                st.source_of(plugin),
                f"kernel module {module}: {error}",
                "onnxep_kernels",
                provider=provider.name,
            )
        )
    for spec in specs:
        if not isinstance(spec, KernelSpec):
            raise TypeError(f"returned a {type(spec).__name__} among its kernels, not a KernelSpec")
        provider.registry.add(spec, source=plugin)


def _own_rewrites(st: _Start, provider: Provider) -> list[Any]:
    hook = "onnxep_graph_rewrites"
    passes: list[Any] = []
    for impl in st.impls(hook, st.plugin):
        try:
            passes.extend(_invoke(impl, {"provider": provider, "level": "extended"}) or ())
        except Exception as exc:
            raise OwnHookRaised(hook, exc) from exc
    return passes


def refusals(provider: Provider) -> list[KernelConflict | KernelShadowed]:
    """The provider's kernel registrations that were refused or are shadowed."""
    return [*provider.registry.conflicts, *provider.registry.shadowed]
