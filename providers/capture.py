"""The capture contract: what a provider's ``onnxep_capture_policy`` hook returns.

A provider that can record its steps as device graphs (CUDA graphs, say)
answers the hook with a :class:`CaptureConfig`; its ``backend`` makes the
:class:`CaptureBackend` that begins and ends captures, launches graphs and
owns their memory. The core decides what runs when (warm-up, capture, replay,
fallback); a backend only does the device side, so a fake one on NumPy runs
the whole path on the CPU (docs/providers.md, section 8).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["CAPTURE_MODES", "CaptureBackend", "CaptureConfig"]

#: the modes a config may name: ``off``; ``whole`` (one graph, or an error naming every seam);
#: ``segmented`` (graphs between the steps that cannot be captured); ``auto`` (whole where
#: it can be, else segmented, else off, with the reason)
CAPTURE_MODES = ("off", "whole", "segmented", "auto")


class CaptureBackend(Protocol):
    """The device side of capture (the CUDA provider's lives in providers_cuda/graphs.py)."""

    def memory(self) -> Any:
        """A private memory scope for one cache entry, with ``allocating()`` (a context
        manager making it the allocator); kept alive as long as the entry's graphs."""

    def capture(self, run: Callable[[], None], state: list, outputs: Sequence[int]) -> Any:
        """Record ``run`` as a graph; end the capture even when ``run`` raises."""

    def launch(self, graph: Any) -> None: ...

    def constant(self, value: Any, memory: Any) -> Any:
        """Upload, inside a capture, a host value that is the same on every replay."""

    def fixed(self, value: Any) -> Any:
        """A new buffer holding a copy of ``value`` (a device array, or host data to upload)."""

    def copy_into(self, dst: Any, src: Any) -> None:
        """Write ``src`` (host or device) into the buffer ``dst`` of the same shape."""

    def duplicate(self, value: Any) -> Any:
        """A copy of a device buffer, handed to the caller."""

    def is_device(self, value: Any) -> bool: ...

    def address(self, value: Any) -> int:
        """Where a device array's data starts (what a graph recorded reading it bakes in).
        Optional: without it, every feed is copied into a fixed buffer."""


@dataclass(frozen=True)
class CaptureConfig:
    """What a provider's capture-policy hook returns."""

    mode: str
    backend: Callable[[], CaptureBackend]
    #: the names and devices of the providers whose steps may be captured
    capturing: frozenset[str]
    warmup: int = 2
    cache_size: int = 8
    #: where the mode came from, for the reason shown ("option", "environment", "default")
    source: str = "option"
