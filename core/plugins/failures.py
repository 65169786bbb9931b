"""What went wrong with plugins, recorded once each and logged once per process.

A record has a ``kind``: ``load`` (the entry point did not import), ``hook``
(a hook raised or returned nonsense), ``refused`` (a kernel registration lost
a conflict), ``shadowed`` (a kernel registration that a higher ``since`` of
another plugin hides at every newer opset) or ``contract`` (a rewrite pass
broke the rewrite contract and was rolled back).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

LOAD = "load"
HOOK = "hook"
REFUSED = "refused"
SHADOWED = "shadowed"
CONTRACT = "contract"

#: Kinds that are a plugin failing, as opposed to one of its kernels being set aside.
FAILED_KINDS = frozenset({LOAD, HOOK, CONTRACT})

_WHAT = {
    LOAD: "failed to load",
    REFUSED: "kernel registration refused",
    SHADOWED: "kernel registration shadowed",
    CONTRACT: "rewrite pass rolled back",
}


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be loaded, one of whose hooks raised, or a kernel set aside.

    ``kind`` defaults to ``hook`` when ``hook`` is given, else ``load``.
    ``provider`` names the provider the record concerns, where there is one,
    and ``effect`` says what onnxep did about it.
    """

    name: str
    entry_point: str
    error: str
    hook: str = ""
    kind: str = ""
    provider: str = ""
    effect: str = ""

    def __post_init__(self) -> None:
        if not self.kind:
            object.__setattr__(self, "kind", HOOK if self.hook else LOAD)

    @property
    def key(self) -> tuple[str, str, str]:
        """What makes two records the same failure: plugin, hook and error."""
        return (self.name, self.hook, self.error)

    @property
    def failed(self) -> bool:
        """True for a plugin that failed; False for a kernel registration set aside."""
        return self.kind in FAILED_KINDS

    def __str__(self) -> str:
        what = _WHAT.get(self.kind) or f"failed in hook {self.hook}"
        if self.provider and self.kind != LOAD:
            what += f" (provider {self.provider!r})"
        tail = f"; {self.effect}" if self.effect else ""
        return f"plugin {self.name!r} ({self.entry_point}) {what}: {self.error}{tail}"


class FailureLog:
    """The failures of one plugin host, each recorded once, in the order they happened."""

    def __init__(self) -> None:
        self.records: list[PluginFailure] = []
        self._keys: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()

    def record(self, failure: PluginFailure) -> bool:
        """Add ``failure`` unless the same one is recorded; True when it is new."""
        with self._lock:
            if failure.key in self._keys:
                return False
            self._keys.add(failure.key)
            self.records.append(failure)
            return True


_logged: set[tuple[str, str, str]] = set()
_logged_lock = threading.Lock()


def not_yet_logged(failures: Iterable[PluginFailure]) -> list[PluginFailure]:
    """The failures no session of this process has logged yet; they count as logged now."""
    with _logged_lock:
        fresh = [f for f in failures if f.key not in _logged]
        _logged.update(f.key for f in fresh)
        return fresh


def forget_logged() -> None:
    """Log every failure again once (after a rediscovery)."""
    with _logged_lock:
        _logged.clear()
