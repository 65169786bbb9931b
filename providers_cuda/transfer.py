"""Host <-> device copies through pinned host buffers, queued on the provider's stream.

Uploads copy the NumPy array into a pinned buffer (a host memcpy), queue
the DMA on the stream and return at once; the pinned buffer is kept until
an event recorded after the copy has passed. Downloads queue the DMA into a
pinned NumPy array and wait for the stream, since the host is about to read
it; an asynchronous download waits later, for an event recorded after its
own copy only (greedy decoding queues the next step before it reads a token).
Every copy is counted, so a run's device-to-host reads can be checked.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class TransferCounts:
    """Copies made so far by one provider (cumulative; diff two snapshots for one run)."""

    device_to_host: int = 0
    host_to_device: int = 0
    device_to_host_bytes: int = 0
    host_to_device_bytes: int = 0

    def snapshot(self) -> dict[str, int]:
        return dict(self.__dict__)


class PinnedTransfers:
    """The copies of one provider: its device, its stream, its pool."""

    def __init__(self, cupy: Any, stream: Any, device_id: int) -> None:
        import cupyx

        self._cupy = cupy
        self._empty_pinned = cupyx.empty_pinned
        self.stream = stream
        self.device_id = device_id
        self.counts = TransferCounts()
        self._inflight: deque[tuple[Any, Any]] = deque()
        self._lock = threading.Lock()

    # -- host -> device ---------------------------------------------------------------
    def upload(self, x: np.ndarray, out: Any = None) -> Any:
        """``x`` as a device array (the caller has the device and pool current); with ``out``
        (a C-contiguous device array of x's shape and dtype) copied straight into it."""
        cp = self._cupy
        if out is None:
            out = cp.empty(x.shape, dtype=x.dtype)
        if x.size == 0:
            return out
        pinned = self._empty_pinned(x.shape, dtype=x.dtype)
        np.copyto(pinned, x)
        out.set(pinned, stream=self.stream)
        done = cp.cuda.Event(block=False, disable_timing=True)
        done.record(self.stream)
        with self._lock:
            self._inflight.append((done, pinned))
            self._release_finished()
        c = self.counts
        c.host_to_device += 1
        c.host_to_device_bytes += x.nbytes
        return out

    def _release_finished(self) -> None:
        q = self._inflight
        while q and q[0][0].done:
            q.popleft()

    def release_all(self) -> None:
        """Forget every pinned staging buffer (after the stream was synchronized)."""
        with self._lock:
            self._inflight.clear()

    # -- device -> host -----------------------------------------------------------------
    def download_async(self, x: Any) -> tuple[np.ndarray, Any]:
        """Queue ``x``'s copy into a pinned host array; returns it and an event recorded after
        the copy (the array holds ``x`` once the event has passed)."""
        out = self._empty_pinned(x.shape, dtype=x.dtype)
        done = self._cupy.cuda.Event(block=False, disable_timing=True)
        if x.size:
            x.get(stream=self.stream, out=out)
        done.record(self.stream)
        c = self.counts
        c.device_to_host += 1
        c.device_to_host_bytes += x.nbytes
        return out, done

    def download(self, x: Any) -> np.ndarray:
        """``x`` in pinned host memory, after the stream has delivered it."""
        out = self._empty_pinned(x.shape, dtype=x.dtype)
        if x.size:
            x.get(stream=self.stream, out=out)
            self.stream.synchronize()
        c = self.counts
        c.device_to_host += 1
        c.device_to_host_bytes += x.nbytes
        return out
