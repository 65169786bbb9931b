"""Finding provider plugins: stevedore loads entry points, pluggy holds the hooks.

Entry-point names are read from package metadata first, so a plugin that
plugins.toml disables is never imported. stevedore's load-failure callback
records ``(name, entry point, error)`` instead of raising, and every hook a
plugin implements is called on its own, so one broken plugin is reported and
the others keep working. (pluggy's ``load_setuptools_entrypoints`` aborts on
the first broken plugin, which is why it is not used.)
"""

from __future__ import annotations

import importlib.metadata
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pluggy
from stevedore.named import NamedExtensionManager

from . import hookspecs
from .kernel import KernelSpec
from .provider import Provider, ProviderInfo

GROUP = "onnxep.providers"


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be loaded, or one of whose hooks raised."""

    name: str
    entry_point: str
    error: str
    hook: str = ""

    def __str__(self) -> str:
        where = f" in hook {self.hook}" if self.hook else ""
        return f"plugin {self.name!r} ({self.entry_point}) failed{where}: {self.error}"


@dataclass
class DiscoveredProvider:
    """A provider some plugin offers, with where it came from and whether it can run here."""

    info: ProviderInfo
    plugin: Any
    plugin_name: str
    source: str
    unavailable: str | None = None

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def available(self) -> bool:
        return self.unavailable is None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class PluginHost:
    """All plugins of one configuration, and the providers they offer."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.failures: list[PluginFailure] = []
        self.disabled: list[tuple[str, str]] = []
        self.providers: dict[str, DiscoveredProvider] = {}
        self._sources: dict[str, str] = {}
        self._lock = threading.RLock()

    # -- loading ---------------------------------------------------------------
    def discover(self) -> None:
        eps = {ep.name: ep for ep in importlib.metadata.entry_points(group=GROUP)}
        wanted = []
        for name, ep in sorted(eps.items()):
            if self.config.is_enabled(name):
                wanted.append(name)
            else:
                self.disabled.append((name, ep.value))
        if not wanted:
            return

        # stevedore keeps entry points per group for the process; a package
        # installed since the last discovery must be seen.
        NamedExtensionManager.ENTRY_POINT_CACHE.pop(GROUP, None)

        def failed(_mgr: Any, ep: Any, exc: BaseException) -> None:
            self.failures.append(PluginFailure(ep.name, ep.value, _describe(exc)))

        mgr = NamedExtensionManager(
            GROUP,
            names=wanted,
            invoke_on_load=False,
            on_load_failure_callback=failed,
            on_missing_entrypoints_callback=lambda names: None,
        )
        for ext in mgr:
            self.register(ext.plugin, name=ext.name, source=ext.entry_point.value)

    def register(self, plugin: Any, name: str | None = None, source: str = "register_provider"):
        """Register a plugin object; return the providers it offers."""
        with self._lock:
            pname = name or getattr(plugin, "__name__", None) or type(plugin).__name__
            if self.pm.is_registered(plugin):
                return [p for p in self.providers.values() if p.plugin is plugin]
            base, n = pname, 2
            while self.pm.get_plugin(pname) is not None:
                pname, n = f"{base}#{n}", n + 1
            try:
                self.pm.register(plugin, name=pname)
            except Exception as exc:
                self.failures.append(PluginFailure(pname, source, _describe(exc)))
                return []
            self._sources[pname] = source
            offered = []
            for info in self._call_one(pname, "onnxep_provider_info", {}):
                if not isinstance(info, ProviderInfo):
                    self.failures.append(
                        PluginFailure(
                            pname,
                            source,
                            f"returned {type(info).__name__}, expected ProviderInfo",
                            "onnxep_provider_info",
                        )
                    )
                    continue
                if info.name in self.providers:
                    other = self.providers[info.name]
                    self.failures.append(
                        PluginFailure(
                            pname,
                            source,
                            f"provider name {info.name!r} is already taken by plugin "
                            f"{other.plugin_name!r} ({other.source})",
                            "onnxep_provider_info",
                        )
                    )
                    continue
                dp = DiscoveredProvider(
                    info, plugin, pname, source, unavailable=info.unavailable_reason()
                )
                self.providers[info.name] = dp
                offered.append(dp)
            return offered

    # -- hooks, one plugin at a time -------------------------------------------
    def _impls(self, hook: str, plugin_name: str | None = None):
        caller = getattr(self.pm.hook, hook)
        impls = caller.get_hookimpls()
        if plugin_name is not None:
            impls = [i for i in impls if i.plugin_name == plugin_name]
        return impls

    def _call(self, impl: Any, hook: str, kwargs: dict) -> tuple[bool, Any]:
        try:
            return True, impl.function(*[kwargs[a] for a in impl.argnames])
        except Exception as exc:
            src = self._sources.get(impl.plugin_name, "?")
            self.failures.append(PluginFailure(impl.plugin_name, src, _describe(exc), hook))
            return False, None

    def _call_one(self, plugin_name: str, hook: str, kwargs: dict) -> list[Any]:
        out = []
        for impl in self._impls(hook, plugin_name):
            ok, res = self._call(impl, hook, kwargs)
            if ok and res is not None:
                out.append(res)
        return out

    def call_each(self, hook: str, first: str | None = None, **kwargs: Any):
        """``(plugin_name, result)`` for every plugin implementing ``hook``; ``first`` leads."""
        impls = self._impls(hook)
        impls.sort(key=lambda i: i.plugin_name != first)
        out = []
        for impl in impls:
            ok, res = self._call(impl, hook, kwargs)
            if ok and res is not None:
                out.append((impl.plugin_name, res))
        return out

    # -- providers -------------------------------------------------------------
    def resolve(self, name: str) -> str | None:
        """The provider name that ``name`` (a name or alias, any case) refers to."""
        low = name.lower()
        for pname, dp in self.providers.items():
            if pname.lower() == low:
                return pname
            aliases = set(dp.info.aliases)
            pc = getattr(self.config, "providers", {}).get(pname)
            if pc is not None:
                aliases.update(pc.aliases)
            if low in {a.lower() for a in aliases}:
                return pname
        return None

    def create(self, name: str, options: dict[str, Any]) -> Provider:
        """A fresh Provider for one session, with every plugin's kernels added."""
        dp = self.providers[name]
        made = self._call_one(dp.plugin_name, "onnxep_create_provider", {"options": options})
        provider = made[0] if made else None
        if not isinstance(provider, Provider):
            last = self.failures[-1] if self.failures else None
            why = (
                str(last)
                if last and last.hook == "onnxep_create_provider"
                else "onnxep_create_provider returned no Provider"
            )
            raise RuntimeError(why)
        for plugin_name, specs in self.call_each(
            "onnxep_kernels", first=dp.plugin_name, provider=provider
        ):
            self._add_kernels(provider, plugin_name, specs)
        for conflict in provider.registry.conflicts:
            failure = PluginFailure(
                conflict.refused,
                self._sources.get(conflict.refused, conflict.refused),
                f"for provider {name!r}: {conflict}",
                "onnxep_kernels",
            )
            if failure not in self.failures:
                self.failures.append(failure)
        return provider

    def _add_kernels(self, provider: Provider, plugin_name: str, specs: Iterable[Any]) -> None:
        src = self._sources.get(plugin_name, plugin_name)
        for module, error in getattr(specs, "failures", ()):
            failure = PluginFailure(
                plugin_name, src, f"kernel module {module}: {error}", "onnxep_kernels"
            )
            if failure not in self.failures:
                self.failures.append(failure)
        try:
            for spec in specs:
                if not isinstance(spec, KernelSpec):
                    raise TypeError(f"expected KernelSpec, got {type(spec).__name__}")
                provider.registry.add(spec, source=plugin_name)
        except Exception as exc:
            self.failures.append(PluginFailure(plugin_name, src, _describe(exc), "onnxep_kernels"))

    def rewrites(self, provider: Provider | None, level: str) -> list[Any]:
        passes: list[Any] = []
        first = None if provider is None else self.providers[provider.name].plugin_name
        for _, res in self.call_each(
            "onnxep_graph_rewrites", first, provider=provider, level=level
        ):
            passes.extend(res)
        return passes

    def ordered_names(self) -> list[str]:
        """Every discovered provider in plugins.toml order; unlisted ones go before cpu."""
        order = [n for n in self.config.order if n in self.providers]
        extra = sorted(n for n in self.providers if n not in order)
        if "cpu" in order:
            i = order.index("cpu")
            return order[:i] + extra + order[i:]
        return order + extra


_hosts: dict[Any, PluginHost] = {}
_runtime_plugins: list[tuple[Any, str | None]] = []
_hosts_lock = threading.Lock()


def get_host(config: Any) -> PluginHost:
    """The plugin host for ``config``, discovered once per process."""
    with _hosts_lock:
        host = _hosts.get(config.key)
        if host is None:
            host = PluginHost(config)
            host.discover()
            for plugin, name in _runtime_plugins:
                host.register(plugin, name=name)
            _hosts[config.key] = host
        return host


def register_plugin(plugin: Any, name: str | None = None) -> None:
    """Register ``plugin`` with every current and future host (no packaging needed)."""
    with _hosts_lock:
        _runtime_plugins.append((plugin, name))
        for host in _hosts.values():
            host.register(plugin, name=name)


def reset_hosts() -> None:
    """Forget discovered plugins, so the next session discovers again (tests, new installs)."""
    with _hosts_lock:
        _hosts.clear()


def unregister_plugin(plugin: Any) -> None:
    with _hosts_lock:
        _runtime_plugins[:] = [(p, n) for p, n in _runtime_plugins if p is not plugin]
        _hosts.clear()
