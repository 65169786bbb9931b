"""Turning the ``providers=`` argument into Provider instances, in priority order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from onnxep.providers.discovery import PluginHost
from onnxep.providers.provider import Provider

from .errors import ConfigError, ProviderError

ProviderArg = str | tuple[str, dict[str, Any]]


def _split(entry: Any) -> tuple[str, dict[str, Any]]:
    if isinstance(entry, str):
        return entry, {}
    if isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[0], str):
        opts = entry[1] or {}
        if not isinstance(opts, dict):
            raise ConfigError(f"options for provider {entry[0]!r} must be a dict, got {opts!r}")
        return entry[0], dict(opts)
    raise ConfigError(f"a provider must be a name or a (name, options) tuple, got {entry!r}")


def _unknown(host: PluginHost, name: str) -> ProviderError:
    for f in host.failures:
        if f.name.lower() == name.lower():
            return ProviderError(
                f"provider {name!r} could not be loaded: {f.error} (entry point {f.entry_point})"
            )
    for dname, ep in host.disabled:
        if dname.lower() == name.lower():
            return ProviderError(
                f"provider {name!r} ({ep}) is disabled in plugins.toml "
                f"({', '.join(host.config.sources)}); set providers.{dname}.enabled = true"
            )
    known = ", ".join(sorted(host.providers)) or "none"
    return ProviderError(
        f"unknown provider {name!r}; discovered providers: {known}. "
        "A provider is found through the 'onnxep.providers' entry point of an installed package."
    )


def select_providers(
    host: PluginHost,
    providers: Sequence[Any] | None,
    provider_options: Sequence[dict[str, Any]] | None,
) -> list[tuple[str, dict[str, Any]]]:
    """``(name, options)`` in priority order; asking for an unusable provider is an error."""
    if providers is None:
        names = [n for n in host.ordered_names() if host.providers[n].available]
        entries = [(n, {}) for n in names]
    else:
        if isinstance(providers, str):
            providers = [providers]
        entries = [_split(e) for e in providers]
        if provider_options is not None:
            if len(provider_options) != len(entries):
                raise ConfigError(
                    f"provider_options has {len(provider_options)} entries for "
                    f"{len(entries)} providers; give one dict per provider"
                )
            entries = [(n, {**o, **(po or {})}) for (n, o), po in zip(entries, provider_options)]
    out: list[tuple[str, dict[str, Any]]] = []
    for name, opts in entries:
        real = host.resolve(name)
        if real is None:
            raise _unknown(host, name)
        dp = host.providers[real]
        if not dp.available:
            raise ProviderError(f"provider {real!r} is not available here: {dp.unavailable}")
        if any(real == n for n, _ in out):
            raise ConfigError(f"provider {real!r} is listed twice")
        out.append((real, {**host.config.options_for(real), **opts}))
    if (
        "cpu" not in [n for n, _ in out]
        and "cpu" in host.providers
        and host.providers["cpu"].available
    ):
        out.append(("cpu", host.config.options_for("cpu")))
    if not out:
        raise ProviderError("no provider is available; is onnxep installed with its entry points?")
    return out


def create_providers(
    host: PluginHost, selected: list[tuple[str, dict[str, Any]]]
) -> list[Provider]:
    made: list[Provider] = []
    for name, opts in selected:
        try:
            made.append(host.create(name, opts))
        except Exception as exc:
            raise ProviderError(f"provider {name!r} failed to start: {exc}") from exc
    return made
