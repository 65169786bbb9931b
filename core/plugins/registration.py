"""Process-wide provider queries and run-time registration."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from onnxep.plugins.host import get_host, register_plugin, reset_hosts

from ..errors import ProviderError
from .config import load_config
from .selection import missing_reason, unknown_message


@dataclass(frozen=True)
class ProviderStatus:
    """A discovered provider: where it came from, and why it cannot be used if it cannot.

    ``broken`` is True for a provider whose own plugin failed to start it
    (``reason`` says how); otherwise an unavailable provider's ``reason`` is
    its availability check's answer.
    """

    name: str
    aliases: tuple[str, ...]
    device: str
    version: str
    source: str
    available: bool
    reason: str | None
    broken: bool = False
    #: taken by a session that names no providers (plugins.toml's ``order``); others opt in
    default: bool = False
    #: the plugin's own line about the provider (``ProviderInfo.description``)
    description: str = ""


def get_available_providers() -> list[str]:
    """Providers usable here and now, in default priority order."""
    host = get_host(load_config())
    return [n for n in host.ordered_names() if host.providers[n].available]


def _status(host: Any, n: str) -> ProviderStatus:
    dp = host.providers[n]
    return ProviderStatus(
        n,
        dp.info.aliases,
        dp.info.device,
        dp.info.version,
        dp.source,
        dp.available,
        dp.reason,
        dp.broken is not None,
        n in host.default_names(),
        dp.info.description,
    )


def get_all_providers() -> list[ProviderStatus]:
    """Every discovered provider, available or not (with the reason).

    A provider counts as available until it fails to start in this process;
    :func:`check_providers` starts each one to find out.
    """
    host = get_host(load_config())
    return [_status(host, n) for n in host.ordered_names()]


def provider_status(name: str) -> ProviderStatus | None:
    """The status of the provider ``name`` (or an alias, any case) refers to, or ``None``."""
    host = get_host(load_config())
    real = host.resolve(name)
    return None if real is None else _status(host, real)


def check_providers() -> list[ProviderStatus]:
    """Start every available provider once (configured options), then list them all.

    What ``onnxep providers`` shows: a provider whose plugin fails to create
    it, or raises adding its own kernels or passes, is listed as broken with
    the reason. Starting may touch the device (a CUDA context), which is why
    the cheap queries above do not do it.
    """
    get_host(load_config()).check_started()
    return get_all_providers()


def provider_unavailable_reason(name: str) -> str | None:
    """``None`` when provider ``name`` (or an alias) can be used here, else why not.

    A plugin of that name that failed to load or is disabled has a reason
    too; a name that nothing installed answers to raises :class:`ProviderError`.
    """
    host = get_host(load_config())
    real = host.resolve(name)
    if real is not None:
        return host.providers[real].reason
    why = missing_reason(host, name)
    if why is None:
        raise ProviderError(unknown_message(host, name))
    return f"provider {name!r} {why}"


def plugin_failures() -> list[Any]:
    """Plugins that failed to load, hooks that raised, kernel registrations set aside.

    Each record (:class:`onnxep.plugins.failures.PluginFailure`) appears once
    and has a ``kind``: ``load``, ``hook``, ``refused``, ``shadowed`` or ``contract``.
    """
    return list(get_host(load_config()).failures)


def register_provider(plugin: Any, name: str | None = None) -> None:
    """Register a plugin object created at run time, with no packaging."""
    register_plugin(plugin, name)


def rediscover() -> None:
    """Forget what was discovered so the next session reads entry points again."""
    reset_hosts()
