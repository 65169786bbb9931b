"""The hooks a provider plugin implements (pluggy project name ``onnxep``).

The host, not pluggy's call order, decides provider priority. Hooks that
receive a ``provider`` are called for every provider in a session; a plugin
answers for the providers it cares about and returns ``None`` for the rest,
which is how a plugin adds kernels to another provider.
"""

from __future__ import annotations

from typing import Any

import pluggy

PROJECT = "onnxep"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def onnxep_provider_info() -> Any:
    """Return a :class:`ProviderInfo` for the provider this plugin offers, or None."""


@hookspec
def onnxep_create_provider(options: dict) -> Any:
    """Return the :class:`Provider` instance for one session, configured by ``options``.

    Called only on the plugin whose ``onnxep_provider_info`` named the provider.
    """


@hookspec
def onnxep_kernels(provider: Any) -> Any:
    """Return kernel specs (an iterable of :class:`KernelSpec`) to add to ``provider``."""


@hookspec
def onnxep_graph_rewrites(provider: Any, level: str) -> Any:
    """Return rewrite passes for ``provider`` at ``level`` (``"basic"`` or ``"extended"``).

    ``basic`` passes run on the whole graph before partitioning; they are asked
    for with the session's host provider, whose kernels evaluate constant folds
    (or ``None`` when there is none). ``extended`` passes only see nodes
    ``provider`` owns.
    """


@hookspec
def onnxep_capture_policy(provider: Any, options: dict) -> Any:
    """Return the capture policy for ``provider`` (how plan segments are captured), or None."""


@hookspec
def onnxep_run_observers(session: Any) -> Any:
    """Return an observer for the session's runs (profilers, tracers), or None."""
