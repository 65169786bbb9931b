"""CUDA graphs (an ``onnxep.providers.CaptureBackend``): capture on the provider's stream, a pool.

Each cache entry gets its own ``cupy.cuda.MemoryPool``, made the allocator
while its graphs are captured and its fixed buffers allocated, and kept
alive with the graphs: the addresses a graph bakes in are never handed to
anyone else. Capture uses the provider's stream (the runner enters the
provider's run context first); a capture whose body raises is still ended,
and the half-made graph dropped, before the error goes on to the runner.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np


class _GraphMemory:
    def __init__(self, cupy: Any, provider: Any) -> None:
        self.cupy = cupy
        self._provider = provider
        with cupy.cuda.Device(provider.device_id):
            self.pool = cupy.cuda.MemoryPool()
        #: pinned host copies of the constants a graph uploads: each replay reads them again
        self.pinned: list[Any] = []

    @contextmanager
    def allocating(self) -> Iterator[None]:
        # The provider's run context (entered by uploads inside a kernel) installs the
        # provider's allocator: point it here too, so nothing a graph uses comes from the
        # session pool, which would hand it out again once its Python object is gone.
        p = self._provider
        saved = p.malloc
        p.malloc = self.pool.malloc
        try:
            with self.cupy.cuda.using_allocator(self.pool.malloc):
                yield
        finally:
            p.malloc = saved


class CudaGraphBackend:
    """The :class:`onnxep.providers.CaptureBackend` of one CUDA provider."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider
        self.cupy = provider.cupy

    def memory(self) -> _GraphMemory:
        return _GraphMemory(self.cupy, self.provider)

    def capture(self, run: Callable[[], None], state: list, outputs: Sequence[int]) -> Any:
        stream = self.provider.stream
        stream.begin_capture()
        try:
            run()
        except BaseException:
            try:
                stream.end_capture()  # the capture is invalid: end it and drop the graph
            except Exception:
                pass
            raise
        return stream.end_capture()

    def constant(self, value: Any, memory: _GraphMemory) -> Any:
        """Upload a value that is the same on every replay (shape math), inside a capture:
        from a pinned host copy kept with the graph, which each replay copies again."""
        cp = self.cupy
        if isinstance(value, cp.ndarray):
            return value
        host = np.ascontiguousarray(value)
        if host.dtype.kind not in "biufc":
            return host
        import cupyx

        pinned = cupyx.empty_pinned(host.shape, host.dtype)
        pinned[...] = host
        memory.pinned.append(pinned)
        dev = cp.empty(host.shape, host.dtype)
        if host.nbytes:
            # The runtime's own copy, not ``ndarray.set``: CuPy refuses every host-to-device
            # transfer while the stream captures, but a copy from pinned memory is a graph
            # node CUDA records (a YOLOv8 head's anchor grid is such a value).
            rt = cp.cuda.runtime
            rt.memcpyAsync(
                dev.data.ptr,
                pinned.ctypes.data,
                host.nbytes,
                rt.memcpyHostToDevice,
                self.provider.stream.ptr,
            )
        return dev

    def launch(self, graph: Any) -> None:
        graph.launch(self.provider.stream)

    def fixed(self, value: Any) -> Any:
        cp = self.cupy
        if isinstance(value, cp.ndarray):
            return value.copy()
        return cp.asarray(np.ascontiguousarray(value))

    def copy_into(self, dst: Any, src: Any) -> None:
        if isinstance(src, self.cupy.ndarray):
            dst[...] = src  # on the current stream: the provider's, inside the run context
        else:
            self.provider.copy_into(dst, np.ascontiguousarray(src, dtype=dst.dtype))

    def duplicate(self, value: Any) -> Any:
        return value.copy()

    def is_device(self, value: Any) -> bool:
        return isinstance(value, self.cupy.ndarray)

    def address(self, value: Any) -> int:
        return int(value.data.ptr)
