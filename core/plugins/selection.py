"""Turning the ``providers=`` argument into Provider instances, in priority order.

A provider the user names that is unavailable here (no GPU, no driver, not
installed, failed to load or start) is skipped with one warning saying why and
how to get it, and the session runs on the rest of the list, as onnxruntime
does: one script serves a laptop and a GPU server; options the provider refuses
(a typo, a device id out of range) are an error, as in onnxruntime. ``strict`` (the session's
``disable_fallback``) makes that a :class:`ProviderError` instead. A name that
is neither a discovered provider nor onnxruntime's ``...ExecutionProvider``
form stays an error either way: it is more likely a typo than a portable list.
Providers chosen by default (``providers=None``, and the CPU provider appended
as last resort) are skipped quietly when they fail: the host records why.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

from onnxep.plugins.host import PluginHost, ProviderStartError
from onnxep.providers.provider import Provider

from ..errors import ConfigError, InvalidArgument, ProviderError

ProviderArg = str | tuple[str, dict[str, Any]]


class Selection(list):
    """``(name, options)`` in priority order; ``named`` holds the providers the user listed."""

    def __init__(self, entries: Sequence[tuple[str, dict[str, Any]]], named: set[str]) -> None:
        super().__init__(entries)
        self.named = frozenset(named)


def _split(entry: Any) -> tuple[str, dict[str, Any]]:
    if isinstance(entry, str):
        return entry, {}
    if isinstance(entry, (tuple, list)) and len(entry) == 2 and isinstance(entry[0], str):
        opts = entry[1] or {}
        if not isinstance(opts, dict):
            raise ConfigError(f"options for provider {entry[0]!r} must be a dict, got {opts!r}")
        return entry[0], dict(opts)
    raise ConfigError(f"a provider must be a name or a (name, options) tuple, got {entry!r}")


def missing_reason(host: PluginHost, name: str) -> str | None:
    """Why no discovered provider answers to ``name`` though a plugin of that name exists.

    It completes "provider 'x' ..."; ``None`` when nothing by that name is installed.
    """
    for f in host.failures:
        if f.kind == "load" and f.name.lower() == name.lower():
            return f"could not be loaded: {f.error} (entry point {f.entry_point})"
    for dname, ep in host.disabled:
        if dname.lower() == name.lower():
            return (
                f"({ep}) is disabled in plugins.toml ({', '.join(host.config.sources)}); "
                f"set providers.{dname}.enabled = true"
            )
    return None


def unknown_message(host: PluginHost, name: str) -> str:
    known = ", ".join(sorted(host.providers)) or "none"
    return (
        f"unknown provider {name!r}; discovered providers: {known}. "
        "A provider is found through the 'onnxep.providers' entry point of an installed package."
    )


def _unknown(host: PluginHost, name: str) -> ProviderError:
    why = missing_reason(host, name)
    if why is not None:
        return ProviderError(f"provider {name!r} {why}")
    return ProviderError(unknown_message(host, name))


def skip_warning(name: str, why: str) -> None:
    """The one warning for a listed provider the session runs without."""
    warnings.warn(
        f"provider {name!r} is skipped: {why}. The session runs on the rest of the list; "
        "SessionOptions(disable_fallback=True) makes this an error.",
        UserWarning,
        stacklevel=4,
    )


def _portable_name(name: str) -> bool:
    """onnxruntime's spelling of a provider this install lacks (TensorrtExecutionProvider)."""
    return name.endswith("ExecutionProvider") and len(name) > len("ExecutionProvider")


def select_providers(
    host: PluginHost,
    providers: Sequence[Any] | None,
    provider_options: Sequence[dict[str, Any]] | None,
    strict: bool = False,
) -> Selection:
    """``(name, options)`` in priority order; a listed provider that is unusable here is
    skipped with a warning, or with ``strict`` an error (see the module's note)."""
    named: set[str] = set()
    if providers is None:
        names = [n for n in host.default_names() if host.providers[n].available]
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
            error = _unknown(host, name)
            if strict or not (_portable_name(name) or missing_reason(host, name)):
                raise error
            skip_warning(name, str(error).removeprefix(f"provider {name!r} "))
            continue
        dp = host.providers[real]
        if dp.broken is not None or not dp.available:
            why = (
                f"failed to start: {dp.broken}"
                if dp.broken is not None
                else f"is not available here: {dp.unavailable}"
            )
            if strict:
                raise ProviderError(f"provider {real!r} {why}") from dp.error
            skip_warning(real, why)
            continue
        if any(real == n for n, _ in out):
            raise ConfigError(f"provider {real!r} is listed twice")
        out.append((real, {**host.config.options_for(real), **opts}))
        if providers is not None:
            named.add(real)
    if (
        "cpu" not in [n for n, _ in out]
        and "cpu" in host.providers
        and host.providers["cpu"].available
    ):
        out.append(("cpu", host.config.options_for("cpu")))
    if not out:
        raise ProviderError("no provider is available; is onnxep installed with its entry points?")
    return Selection(out, named)


def create_providers(
    host: PluginHost, selected: list[tuple[str, dict[str, Any]]], strict: bool = False
) -> list[Provider]:
    """Start the selected providers; one that fails is skipped (with a warning if the user
    named it), or with ``strict`` a named one failing is an error.

    A plain list (not a :class:`Selection`) counts every entry as named.
    """
    named = getattr(selected, "named", None)
    made: list[Provider] = []
    skipped: list[str] = []
    named_failures: list[tuple[str, ProviderStartError]] = []
    for name, opts in selected:
        try:
            made.append(host.create(name, opts))
        except ProviderStartError as exc:
            if named is None or name in named:
                # Options the provider refused are the caller's mistake, not this machine's
                # lack: an error, as onnxruntime's for a bad provider option.
                refused = isinstance(exc.__cause__, (ConfigError, InvalidArgument))
                if strict or named is None or refused:
                    raise ProviderError(
                        f"provider {name!r} failed to start: {exc.reason}"
                    ) from exc.__cause__
                named_failures.append((name, exc))
            skipped.append(f"{name}: {exc.reason}")
    if not made and named_failures:
        # nothing left to run on: the first listed failure is the error, not a warning
        name, exc = named_failures[0]
        raise ProviderError(f"provider {name!r} failed to start: {exc.reason}") from exc.__cause__
    if not made:
        raise ProviderError(f"no provider could start: {'; '.join(skipped)}")
    for name, exc in named_failures:
        skip_warning(name, f"failed to start: {exc.reason}")
    return made
