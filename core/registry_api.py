"""Process-wide provider queries and run-time registration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from onnxep.providers.discovery import get_host, register_plugin, reset_hosts

from .config import load_config


@dataclass(frozen=True)
class ProviderStatus:
    """A discovered provider: where it came from, and why it is unavailable if it is."""

    name: str
    aliases: tuple[str, ...]
    device: str
    version: str
    source: str
    available: bool
    reason: str | None


def get_available_providers() -> list[str]:
    """Providers usable here and now, in default priority order."""
    host = get_host(load_config())
    return [n for n in host.ordered_names() if host.providers[n].available]


def get_all_providers() -> list[ProviderStatus]:
    """Every discovered provider, available or not (with the reason)."""
    host = get_host(load_config())
    out = []
    for n in host.ordered_names():
        dp = host.providers[n]
        out.append(
            ProviderStatus(
                n,
                dp.info.aliases,
                dp.info.device,
                dp.info.version,
                dp.source,
                dp.available,
                dp.unavailable,
            )
        )
    return out


def plugin_failures() -> list[Any]:
    """Plugins that failed to load or whose hooks raised, as records with the error."""
    return list(get_host(load_config()).failures)


def register_provider(plugin: Any, name: str | None = None) -> None:
    """Register a plugin object created at run time, with no packaging."""
    register_plugin(plugin, name)


def rediscover() -> None:
    """Forget what was discovered so the next session reads entry points again."""
    reset_hosts()
