"""Finding provider plugins: stevedore loads entry points, pluggy holds the hooks.

Entry-point names are read from package metadata first, so a plugin that
plugins.toml disables is never imported. stevedore's load-failure callback
records ``(name, entry point, error)`` instead of raising, and every hook a
plugin implements is called on its own, so one broken plugin is reported and
the others keep working. (pluggy's ``load_setuptools_entrypoints`` aborts on
the first broken plugin, which is why it is not used.)

Starting a provider calls its own plugin's ``onnxep_create_provider``,
``onnxep_kernels`` and ``onnxep_graph_rewrites`` (``extended``). When one of
them raises with the provider's configured options, the provider is *broken*
for the process: it is recorded with the reason, default selections skip it,
naming it skips it with a warning (an error carrying the original exception under
``disable_fallback``). Another plugin's
hook raising for the provider is that plugin's failure, recorded, and the
provider keeps working.
"""

from __future__ import annotations

import importlib.metadata
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import pluggy
from stevedore.named import NamedExtensionManager

from . import hookspecs
from .failures import CONTRACT, FailureLog, PluginFailure, forget_logged, not_yet_logged
from .provider import Provider, ProviderInfo
from .starting import OwnHookRaised, ProviderStartError, describe, refusals, start_provider

__all__ = [
    "GROUP",
    "DiscoveredProvider",
    "PluginFailure",
    "PluginHost",
    "ProviderStartError",
    "get_host",
    "register_plugin",
    "reset_hosts",
    "unregister_plugin",
]

GROUP = "onnxep.providers"


@dataclass
class DiscoveredProvider:
    """A provider some plugin offers, with where it came from and whether it can run here.

    ``unavailable`` is the availability check's reason; ``broken`` says why
    the provider failed to start with its configured options, and ``error``
    is the exception behind it.
    """

    info: ProviderInfo
    plugin: Any
    plugin_name: str
    source: str
    unavailable: str | None = None
    broken: str | None = None
    error: BaseException | None = None

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def available(self) -> bool:
        return self.unavailable is None and self.broken is None

    @property
    def reason(self) -> str | None:
        """Why the provider cannot be used, or ``None``."""
        if self.unavailable is not None:
            return self.unavailable
        if self.broken is not None:
            return f"failed to start: {self.broken}"
        return None


class PluginHost:
    """All plugins of one configuration, and the providers they offer."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self._log = FailureLog()
        self.disabled: list[tuple[str, str]] = []
        self.providers: dict[str, DiscoveredProvider] = {}
        self._sources: dict[str, str] = {}
        self._lock = threading.RLock()
        self._checked: set[str] = set()
        # The owner's extended passes, asked for at start (so a raising hook
        # breaks the provider before any session uses it), kept for the session.
        self._own_passes: weakref.WeakKeyDictionary[Provider, list[Any]] = (
            weakref.WeakKeyDictionary()
        )

    # -- failures ----------------------------------------------------------------
    @property
    def failures(self) -> list[PluginFailure]:
        """Every failure, once each (plugin, hook, error), in the order they happened."""
        return self._log.records

    def record(self, failure: PluginFailure) -> bool:
        """Record ``failure`` unless it is already recorded; True when it is new."""
        return self._log.record(failure)

    def failures_to_log(self) -> list[PluginFailure]:
        """The failures not yet logged in this process (each is logged once)."""
        return not_yet_logged(self.failures)

    def source_of(self, plugin_name: str) -> str:
        return self._sources.get(plugin_name, plugin_name)

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
            self.record(PluginFailure(ep.name, ep.value, describe(exc)))

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
                self.record(PluginFailure(pname, source, describe(exc)))
                return []
            self._sources[pname] = source
            offered = []
            for info in self._call_one(pname, "onnxep_provider_info", {}):
                if not isinstance(info, ProviderInfo):
                    self.record(
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
                    self.record(
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
    def impls(self, hook: str, plugin_name: str | None = None) -> list[Any]:
        """pluggy's implementations of ``hook`` (of one plugin when ``plugin_name`` is given)."""
        caller = getattr(self.pm.hook, hook)
        impls = caller.get_hookimpls()
        if plugin_name is not None:
            impls = [i for i in impls if i.plugin_name == plugin_name]
        return impls

    def _call(self, impl: Any, hook: str, kwargs: dict, provider: str = "") -> tuple[bool, Any]:
        try:
            return True, impl.function(*[kwargs[a] for a in impl.argnames])
        except Exception as exc:
            self.record(
                PluginFailure(
                    impl.plugin_name,
                    self.source_of(impl.plugin_name),
                    describe(exc),
                    hook,
                    provider=provider,
                )
            )
            return False, None

    def _call_one(self, plugin_name: str, hook: str, kwargs: dict) -> list[Any]:
        out = []
        for impl in self.impls(hook, plugin_name):
            ok, res = self._call(impl, hook, kwargs)
            if ok and res is not None:
                out.append(res)
        return out

    def call_each(self, hook: str, first: str | None = None, **kwargs: Any):
        """``(plugin_name, result)`` for every plugin implementing ``hook``; ``first`` leads."""
        impls = self.impls(hook)
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
        """A fresh Provider for one session, with every plugin's kernels added.

        Raises :class:`ProviderStartError` (caused by what the plugin raised)
        when the provider's own plugin fails; with the configured options the
        provider is then marked broken and the failure recorded.
        """
        dp = self.providers[name]
        if dp.broken is not None:
            raise ProviderStartError(name, dp.broken) from dp.error
        try:
            provider, passes = start_provider(self, dp, options)
        except OwnHookRaised as raised:
            reason = (
                f"plugin {dp.plugin_name!r} ({dp.source}) failed in hook {raised.hook}: "
                f"{describe(raised.error)}"
            )
            if options == self.config.options_for(name):
                self._mark_broken(dp, reason, raised)
            raise ProviderStartError(name, reason) from raised.error
        try:
            self._own_passes[provider] = passes
        except TypeError:  # an unhashable Provider: its plugin is asked again later
            pass
        for rec in refusals(provider):
            self.record(
                PluginFailure(
                    rec.refused,
                    self.source_of(rec.refused),
                    str(rec),
                    "onnxep_kernels",
                    kind=rec.kind,
                    provider=name,
                )
            )
        return provider

    def _mark_broken(self, dp: DiscoveredProvider, reason: str, raised: OwnHookRaised) -> None:
        with self._lock:
            if dp.broken is None:
                dp.broken, dp.error = reason, raised.error
        self.record(
            PluginFailure(
                dp.plugin_name,
                dp.source,
                describe(raised.error),
                raised.hook,
                provider=dp.name,
                effect=f"provider {dp.name!r} is broken: sessions skip it (an error under "
                "disable_fallback)",
            )
        )

    def check_started(self) -> None:
        """Start every available provider once with its configured options (then drop it).

        A provider whose own plugin fails is marked broken with the reason,
        so listings stop calling it available.
        """
        for name in self.ordered_names():
            dp = self.providers[name]
            if name in self._checked or not dp.available:
                continue
            self._checked.add(name)
            try:
                self.create(name, self.config.options_for(name))
            except ProviderStartError:
                pass  # recorded, and the provider marked broken, by create()

    # -- rewrites --------------------------------------------------------------
    def rewrites_by_plugin(self, provider: Provider | None, level: str) -> list[tuple[str, Any]]:
        """``(plugin_name, pass)`` for every plugin's passes at ``level``, ``provider``'s first."""
        first = None
        if provider is not None and provider.name in self.providers:
            first = self.providers[provider.name].plugin_name
        own = None
        if provider is not None and level == "extended":
            own = self._own_passes.pop(provider, None)
        impls = sorted(self.impls("onnxep_graph_rewrites"), key=lambda i: i.plugin_name != first)
        out: list[tuple[str, Any]] = []
        name = "" if provider is None else provider.name
        for impl in impls:
            if impl.plugin_name == first and own is not None:
                out += [(first, p) for p in own]
                continue
            kwargs = {"provider": provider, "level": level}
            ok, res = self._call(impl, "onnxep_graph_rewrites", kwargs, provider=name)
            if ok and res is not None:
                out += [(impl.plugin_name, p) for p in res]
        return out

    def rewrites(self, provider: Provider | None, level: str) -> list[Any]:
        return [p for _, p in self.rewrites_by_plugin(provider, level)]

    def pass_rolled_back(self, plugin_name: str, provider: str, problem: str) -> None:
        """Record that a rewrite pass broke the contract and was undone."""
        self.record(
            PluginFailure(
                plugin_name,
                self.source_of(plugin_name),
                problem,
                "onnxep_graph_rewrites",
                kind=CONTRACT,
                provider=provider,
                effect="the pass was rolled back and left out of the session",
            )
        )

    def default_names(self) -> list[str]:
        """The providers a session takes when none are named: plugins.toml's ``order``.

        An installed provider that ``order`` does not name is opt-in (named in
        ``providers=``, or added to the order by a plugins.toml of the user's), so
        installing a package never changes what an existing script runs on. One
        the program registered itself (``onnxep.register_provider``) is an explicit
        choice: it joins the default before cpu, as unlisted providers once did.
        """
        order = [n for n in self.config.order if n in self.providers]
        chosen = sorted(
            n
            for n, dp in self.providers.items()
            if n not in order and dp.source == "register_provider"
        )
        if "cpu" in order:
            i = order.index("cpu")
            return order[:i] + chosen + order[i:]
        return order + chosen

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
    """Forget discovered plugins and broken providers, so the next session discovers again.

    Failures found again after this are logged again (once).
    """
    with _hosts_lock:
        _hosts.clear()
    forget_logged()


def unregister_plugin(plugin: Any) -> None:
    with _hosts_lock:
        _runtime_plugins[:] = [(p, n) for p, n in _runtime_plugins if p is not plugin]
        _hosts.clear()
