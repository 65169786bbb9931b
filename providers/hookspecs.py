"""The hooks a provider plugin implements (pluggy project name ``onnxep``).

The host, not pluggy's call order, decides provider priority. Hooks that
receive a ``provider`` are called for every provider in a session; a plugin
answers for the providers it cares about and returns ``None`` for the rest,
which is how a plugin adds kernels to another provider.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from .capture import CaptureConfig
    from .kernel import KernelSpec
    from .provider import Provider, ProviderInfo

PROJECT = "onnxep"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def onnxep_provider_info() -> ProviderInfo | None:
    """Return a :class:`ProviderInfo` for the provider this plugin offers, or None."""


@hookspec
def onnxep_create_provider(options: dict) -> Provider:
    """Return the :class:`Provider` instance for one session, configured by ``options``.

    Called only on the plugin whose ``onnxep_provider_info`` named the provider.
    """


@hookspec
def onnxep_kernels(provider: Provider) -> Iterable[KernelSpec] | None:
    """Return kernel specs (an iterable of :class:`KernelSpec`) to add to ``provider``."""


@hookspec
def onnxep_graph_rewrites(provider: Provider | None, level: str) -> Iterable[Any] | None:
    """Return rewrite passes for ``provider`` at ``level`` (``"basic"`` or ``"extended"``).

    ``basic`` passes run on the whole graph before partitioning; they are asked
    for with the session's host provider, whose kernels evaluate constant folds
    (or ``None`` when there is none). ``extended`` passes only see nodes
    ``provider`` owns.
    """


@hookspec
def onnxep_capture_policy(provider: Provider, options: dict) -> CaptureConfig | None:
    """Return a :class:`CaptureConfig` (how ``provider``'s plan segments are recorded as
    device graphs, and the backend that does it), or None.

    Asked for each device provider of a session, in priority order; the first config
    wins. Anything else returned is recorded as the plugin's failure and ignored.
    """
