"""The CUDA provider: CuPy arrays on one device, one stream, one memory pool per session.

Each session gets its own provider instance, so two sessions on two
``device_id``s (or twice on one device) keep separate streams and pools.
CuPy keeps the current device, stream and allocator per thread; the
executor enters :meth:`CUDAProvider.run_context` around every run, which
makes this provider's three current on the calling thread, and kernel
builders and uploads enter it too. Values cross to the host only through
:meth:`to_host`, which counts every read. Index kernels report bad indices
in the provider's :class:`~.error_flag.ErrorFlag`, which :meth:`to_host` and
:meth:`synchronize` check where they synchronize anyway.
"""

from __future__ import annotations

import contextlib
import threading
import traceback
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from onnxep.errors import ConfigError, RunError
from onnxep.providers import Claim, Decline, NodeInfo, Provider
from onnxep.providers.kernel import normalize_domain

from . import error_flag
from .declines import CONTROL_FLOW, DECLINED_OPS, dtype_refusal
from .errors import DeviceOutOfMemory
from .math_mode import allow_tf32
from .options import CUDAOptions, parse_options, stream_handle
from .transfer import PinnedTransfers
from .xp import cuda_namespace


def _oom_in(exc: BaseException | None, oom_type: type) -> BaseException | None:
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, oom_type):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def _drop_frames(exc: BaseException | None) -> None:
    """Clear the locals of a failed run's frames, so its device arrays go back to the pool."""
    seen = 0
    while exc is not None and seen < 8:
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__
        seen += 1


class CUDAProvider(Provider):
    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        import cupy

        opts: CUDAOptions = parse_options(dict(options or {}))
        count = cupy.cuda.runtime.getDeviceCount()
        if opts.device_id >= count:
            raise ConfigError(
                f"device_id {opts.device_id} is out of range: this machine has {count} CUDA "
                f"device(s), numbered 0 to {count - 1}"
            )
        super().__init__("cuda", options, device="cuda", xp=cuda_namespace())
        self.cuda_options = opts
        self.device_id = opts.device_id
        self.cupy = cupy
        with cupy.cuda.Device(self.device_id):
            self.pool = cupy.cuda.MemoryPool()
            if opts.gpu_mem_limit is not None:
                self.pool.set_limit(size=opts.gpu_mem_limit)
            if opts.stream is not None:
                self.stream = self._external_stream(opts.stream)
            else:
                self.stream = cupy.cuda.Stream(non_blocking=True)
            with cupy.cuda.using_allocator(self.pool.malloc):
                self.error_flag = error_flag.ErrorFlag.on_device(cupy, self.stream)
        self.malloc = self.pool.malloc
        self._nesting = threading.local()
        # Runs on this provider are one at a time: they share one stream, and a captured
        # graph's fixed feed and output buffers; a run from a second thread while the first
        # captures would add its work to (and invalidate) the graph being recorded, and two
        # replays interleaved on the host would read each other's feeds.
        self._runs = threading.RLock()
        self.transfers = PinnedTransfers(cupy, self.stream, self.device_id)
        self._argmax: Any = None  # ops/argmax_cuda.ArgMaxRows, built at the first call
        props = cupy.cuda.runtime.getDeviceProperties(self.device_id)
        self.device_name = props["name"].decode(errors="replace")

    def _external_stream(self, stream: Any) -> Any:
        cp = self.cupy
        if isinstance(stream, cp.cuda.Stream | cp.cuda.ExternalStream):
            return stream
        return cp.cuda.ExternalStream(stream_handle(stream), self.device_id)

    # -- where work happens -------------------------------------------------------------
    @contextlib.contextmanager
    def run_context(self) -> Iterator[None]:
        """Make this provider's device, stream and memory pool current on this thread.

        Work the caller queued on its current stream is ordered before the
        run, and the caller's stream waits for the run's work, so device
        arrays flow both ways without a host synchronization.
        """
        cp = self.cupy
        outermost = not getattr(self._nesting, "depth", 0)
        with self._runs, cp.cuda.Device(self.device_id):
            caller = cp.cuda.get_current_stream()
            own = self.stream
            foreign = caller.ptr != own.ptr
            if foreign:
                own.wait_event(caller.record())
            self._nesting.depth = getattr(self._nesting, "depth", 0) + 1
            try:
                with (
                    own,
                    cp.cuda.using_allocator(self.malloc),
                    allow_tf32(self.cuda_options.use_tf32),
                ):
                    yield
            except BaseException as exc:
                # Only the outermost context speaks: an upload inside a run is part of the run.
                oom = _oom_in(exc, cp.cuda.memory.OutOfMemoryError) if outermost else None
                if oom is None:
                    raise
                raise self._out_of_memory(exc, oom) from None
            finally:
                self._nesting.depth -= 1
                if foreign:
                    caller.wait_event(own.record())

    def _out_of_memory(self, exc: BaseException, oom: BaseException) -> DeviceOutOfMemory:
        where = str(exc) if isinstance(exc, RunError) else f"{type(exc).__name__}: {exc}"
        where = where.split(": OutOfMemoryError")[0]
        _drop_frames(exc)
        self.pool.free_all_blocks()
        limit = self.cuda_options.gpu_mem_limit
        if limit is not None:
            cap = (
                f"gpu_mem_limit={limit} bytes (this session's pool holds "
                f"{self.pool.used_bytes()} bytes in use)"
            )
            fix = "run smaller inputs, free device arrays you hold, or raise gpu_mem_limit"
        else:
            free, total = self.cupy.cuda.runtime.memGetInfo()
            cap = f"the GPU's memory ({free} of {total} bytes free)"
            fix = "run smaller inputs or free device memory held elsewhere"
        return DeviceOutOfMemory(
            f"{where}: out of device memory under {cap}. The run's arrays were released and "
            f"the session stays usable: {fix}. ({oom})"
        )

    def synchronize(self) -> None:
        """Wait for the stream; raises RunError if an index kernel met a bad index since the
        last check (the record is cleared, so the session stays usable)."""
        with self.cupy.cuda.Device(self.device_id):
            self.error_flag.before_sync()
            self.stream.synchronize()
            self.transfers.release_all()
            self.error_flag.after_sync()

    # -- claiming ---------------------------------------------------------------------------
    def claim(self, node: NodeInfo) -> Claim | Decline:
        why = self.decline_reason(node)
        if why is not None:
            return Decline(why)
        with self.run_context(), error_flag.building(self.error_flag):
            return super().claim(node)

    @staticmethod
    def decline_reason(node: NodeInfo) -> str | None:
        """Why this provider will not run ``node`` whatever its kernels say, or None."""
        op = node.op_type
        key = (normalize_domain(node.domain), op)
        if key in DECLINED_OPS:
            return DECLINED_OPS[key]
        if node.subgraphs and key not in CONTROL_FLOW:
            return f"{op}: its subgraphs run on the host"
        for v in (*node.inputs, *node.outputs):
            if v is None:
                continue
            if v.kind not in ("tensor", "unknown"):
                return f"{op}: {v.kind} values stay on the host"
            why = dtype_refusal(v.dtype)
            if why is not None:
                return f"{op}: {why} (value {v.name!r})"
        return None

    # -- data movement --------------------------------------------------------------------
    def to_host(self, value: Any) -> Any:
        """A host copy of a device array; raises RunError (after the copy's own wait) if an
        index kernel met a bad index since the last check."""
        cp = self.cupy
        if isinstance(value, cp.ndarray):
            with cp.cuda.Device(self.device_id), self.stream:
                if not value.flags.c_contiguous:
                    value = cp.ascontiguousarray(value)  # a view: gathered on our stream
                if not value.size:
                    return self.transfers.download(value)  # no wait: the next read checks
                self.error_flag.before_sync()
                host = self.transfers.download(value)
                self.error_flag.after_sync()  # clearing a set record queues on our device
            return host
        return value

    def to_host_async(self, value: Any) -> Any:
        """Queue a device array's copy into pinned host memory; the returned callable waits for
        that copy alone and returns the host array, raising RunError there (as :meth:`to_host`
        does) if an index kernel met a bad index before the copy."""
        cp = self.cupy
        if not isinstance(value, cp.ndarray):
            return super().to_host_async(value)
        with cp.cuda.Device(self.device_id), self.stream:
            if not value.flags.c_contiguous:
                value = cp.ascontiguousarray(value)
            self.error_flag.before_sync()
            host, done = self.transfers.download_async(value)

        def wait() -> Any:
            done.synchronize()
            with cp.cuda.Device(self.device_id):
                self.error_flag.after_sync()
            return host

        return wait

    def argmax_rows_into(self, x: Any, out: Any) -> None:
        """One launch per call (``ops/argmax_cuda``) for float16/float32 rows of unit stride,
        written straight into ``out``; anything else through CuPy's argmax."""
        with self.run_context():
            if self._argmax is None:
                from .ops.argmax_cuda import ArgMaxRows

                self._argmax = ArgMaxRows(self.cupy)
            if self._argmax.takes(x) and out.dtype == np.int64 and out.size == x.shape[0]:
                stride = out.strides[0] // out.itemsize if out.ndim else 1
                self._argmax(x, out, stride)
            else:
                super().argmax_rows_into(x, out)

    def from_host(self, value: Any) -> Any:
        if value is None or isinstance(value, list):
            return value  # an empty optional, or a sequence: both stay on the host
        cp = self.cupy
        if isinstance(value, cp.ndarray):
            if value.device.id == self.device_id:
                return value
            with self.run_context():
                return cp.array(value, copy=True)  # a peer copy from another GPU
        if not isinstance(value, np.ndarray):
            if hasattr(value, "__cuda_array_interface__"):
                return self.adopt(value)
            if hasattr(value, "__dlpack__") and _dlpack_on_cuda(value):
                return self.adopt(value)
            value = np.asarray(value)
        if value.dtype.kind not in "biufc":
            return value  # strings and objects stay on the host
        with self.run_context():
            return self.transfers.upload(value)

    def adopt(self, value: Any) -> Any:
        """A CuPy view of another library's device array, without a copy.

        Takes CuPy arrays, objects with ``__cuda_array_interface__`` (numba,
        pycuda-style) and DLPack producers on CUDA (torch); the array must be
        on this provider's device.
        """
        cp = self.cupy
        if isinstance(value, cp.ndarray):
            arr = value
        elif hasattr(value, "__cuda_array_interface__"):
            arr = cp.asarray(value)
        elif hasattr(value, "__dlpack__"):
            arr = cp.from_dlpack(value)
        else:
            raise TypeError(
                f"{type(value).__name__} is not a device array: pass a CuPy array, or an object "
                "with __cuda_array_interface__ or __dlpack__ on a CUDA device"
            )
        if arr.device.id != self.device_id:
            raise ValueError(
                f"the array is on CUDA device {arr.device.id} but this session runs on device "
                f"{self.device_id}; copy it first or create the session with "
                f"device_id={arr.device.id}"
            )
        return arr

    def wrap_pointer(self, ptr: int, shape: tuple[int, ...], dtype: Any) -> Any:
        """A CuPy array over device memory the caller owns (onnxruntime's ``buffer_ptr``)."""
        cp = self.cupy
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        mem = cp.cuda.UnownedMemory(ptr, nbytes, None, self.device_id)
        return cp.ndarray(shape, dtype, cp.cuda.MemoryPointer(mem, 0))

    def copy_into(self, dst: Any, src: Any) -> None:
        """Write ``src`` into the device array ``dst`` in place, ordered after the run."""
        with self.run_context():
            if isinstance(src, np.ndarray):
                if (
                    dst.flags.c_contiguous
                    and dst.shape == src.shape
                    and dst.dtype == src.dtype
                    and src.flags.c_contiguous
                ):
                    self.transfers.upload(src, out=dst)  # one copy, no device-side kernel
                    return
                src = self.transfers.upload(src)
            dst[...] = src

    def transfer_counts(self) -> dict[str, int]:
        """Copies made so far (cumulative): ``device_to_host``, ``host_to_device`` and bytes."""
        return self.transfers.counts.snapshot()

    def describe(self) -> dict[str, Any]:
        """The device, stream and pool this provider runs with (for reports and benchmarks)."""
        return {
            "device_id": self.device_id,
            "device": self.device_name,
            "stream": self.stream.ptr,
            "gpu_mem_limit": self.cuda_options.gpu_mem_limit,
            "use_tf32": self.cuda_options.use_tf32,
            "pool_used_bytes": self.pool.used_bytes(),
            "pool_total_bytes": self.pool.total_bytes(),
            "ignored_options": list(self.cuda_options.ignored),
            "programmatic_launch": self._programmatic_launch(),
        }

    def _programmatic_launch(self) -> bool:
        from .launch import programmatic_launch

        with self.cupy.cuda.Device(self.device_id):
            return programmatic_launch()


def _dlpack_on_cuda(value: Any) -> bool:
    try:
        kind, _ = value.__dlpack_device__()
    except Exception:
        return False
    return int(kind) in (2, 3, 13)  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged
