"""Launching a loaded kernel with the least host work: ``cuLaunchKernel`` through ctypes.

CuPy's ``Function.__call__`` inspects and converts every argument on every
launch (about 7.6 us on the H200 host); hot elementwise kernels take only
pointers and integers, so a :class:`Launcher` keeps per-thread ctypes slots
for them and calls the driver directly. Where the driver library or the
function handle is not reachable it falls back to CuPy's call, with the
same argument values (a pointer is an int64 either way).
"""

from __future__ import annotations

import ctypes
import struct
import sys
import threading
from typing import Any

#: Argument codes: ``p`` device pointer, ``q`` int64, ``d`` float64, ``i`` int32, ``f`` float32.
_CTYPES = {
    "p": ctypes.c_uint64,
    "q": ctypes.c_int64,
    "d": ctypes.c_double,
    "i": ctypes.c_int32,
    "f": ctypes.c_float,
}
#: cuLaunchKernel's ``extra`` keys: the arguments as one packed buffer.
_BUFFER_POINTER, _BUFFER_SIZE, _END = 1, 2, 0

_driver: Any = None
_driver_ex: Any = None
_driver_lock = threading.Lock()
#: Devices (ordinal -> bool) where programmatic dependent launch is used.
_pdl: dict[int, bool] = {}
#: ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``, the attribute that lets a kernel
#: start while the one before it in the stream runs (its ``pdl_wait`` then orders the reads).
_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute``: the id, padding to 8 bytes, a 64-byte value union."""

    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_int), ("value", ctypes.c_char * 64)]


class _LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig``."""

    _fields_ = [
        ("gridDimX", ctypes.c_uint),
        ("gridDimY", ctypes.c_uint),
        ("gridDimZ", ctypes.c_uint),
        ("blockDimX", ctypes.c_uint),
        ("blockDimY", ctypes.c_uint),
        ("blockDimZ", ctypes.c_uint),
        ("sharedMemBytes", ctypes.c_uint),
        ("hStream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_LaunchAttribute)),
        ("numAttrs", ctypes.c_uint),
    ]


def _launch_fn() -> Any:
    global _driver
    if _driver is None:
        with _driver_lock:
            if _driver is None:
                name = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
                lib = ctypes.CDLL(name)
                fn = lib.cuLaunchKernel
                u = ctypes.c_uint
                fn.argtypes = [ctypes.c_void_p, u, u, u, u, u, u, u]
                fn.argtypes += [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
                fn.restype = ctypes.c_int
                _driver = fn
    return _driver


def _launch_ex_fn() -> Any:
    """``cuLaunchKernelEx`` (CUDA 12.0 and up), or AttributeError on an older driver."""
    global _driver_ex
    if _driver_ex is None:
        with _driver_lock:
            if _driver_ex is None:
                name = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
                fn = ctypes.CDLL(name).cuLaunchKernelEx
                fn.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p]
                fn.argtypes += [ctypes.c_void_p, ctypes.c_void_p]
                fn.restype = ctypes.c_int
                _driver_ex = fn
    return _driver_ex


def programmatic_launch() -> bool:
    """Whether kernels that opt in start while the kernel before them runs (programmatic
    dependent launch) on the current device: compute capability 9.0 and up, a driver with
    ``cuLaunchKernelEx``, and ``ONNXEP_CUDA_PDL`` not ``0`` (the switch for comparisons)."""
    import os

    import cupy

    dev = cupy.cuda.runtime.getDevice()
    on = _pdl.get(dev)
    if on is None:
        major = cupy.cuda.runtime.getDeviceProperties(dev)["major"]
        try:
            _launch_ex_fn()
            found = True
        except (OSError, AttributeError):
            found = False
        on = _pdl[dev] = major >= 9 and found
    return on and os.environ.get("ONNXEP_CUDA_PDL", "1") != "0"


class Launcher:
    """One kernel, launched with arguments of a fixed signature (``"pppq"``...)."""

    def __init__(
        self, function: Any, signature: str, *, use_driver: bool = True, dependent: bool = False
    ) -> None:
        """``function``: a ``cupy.RawKernel`` (as ``nvrtc.function`` returns) or its loaded
        ``cupy.cuda.Function``, on the current device. ``dependent``: the kernel calls
        ``pdl_wait`` before its first access to memory an earlier kernel writes, so it may be
        launched to start while that kernel runs (where :func:`programmatic_launch` allows)."""
        self.function = function
        self.signature = signature
        self._local = threading.local()
        self._launch = None
        self._launch_ex = None
        loaded = getattr(function, "kernel", function)  # RawKernel -> its cuda.Function
        self._ptr = getattr(loaded, "ptr", None)
        if set(signature) - set("pqd"):
            use_driver = False  # packing is only written for 8-byte arguments
        self._pack = struct.Struct("<" + signature.replace("p", "Q")).pack_into
        if use_driver and isinstance(self._ptr, int) and self._ptr:
            try:
                self._launch = _launch_fn()
            except (OSError, AttributeError):
                self._launch = None
        if self._launch is not None and dependent and programmatic_launch():
            self._launch_ex = _launch_ex_fn()

    @property
    def dependent(self) -> bool:
        """Whether launches carry the programmatic-dependent-launch attribute."""
        return self._launch_ex is not None

    def _config(self) -> Any:
        """This thread's ``CUlaunchConfig`` with the attribute (the caller fills the rest)."""
        cfg = getattr(self._local, "config", None)
        if cfg is None:
            attr = _LaunchAttribute(_PROGRAMMATIC_STREAM_SERIALIZATION, 0, b"\x01")
            cfg = _LaunchConfig(1, 1, 1, 1, 1, 1, 0, None, ctypes.pointer(attr), 1)
            self._local.config = cfg
            self._local.attr = attr  # the config points at it
        return cfg

    @property
    def direct(self) -> bool:
        """Whether launches go straight to the driver (else through CuPy)."""
        return self._launch is not None

    def _packed(self) -> tuple[Any, Any]:
        """This thread's argument buffer and the ``extra`` array pointing at it.

        Every argument here is 8 bytes (pointers, int64, float64), so the kernel's
        parameter block is the arguments packed back to back, written with
        one ``struct.pack_into`` per launch.
        """
        slot = getattr(self._local, "packed", None)
        if slot is None:
            size = 8 * len(self.signature)
            buf = ctypes.create_string_buffer(size)
            nbytes = ctypes.c_size_t(size)
            extra = (ctypes.c_void_p * 5)(
                _BUFFER_POINTER, ctypes.addressof(buf), _BUFFER_SIZE, ctypes.addressof(nbytes), _END
            )
            slot = self._local.packed = (buf, extra, nbytes)
        return slot[0], slot[1]

    def __call__(
        self,
        grid: int | tuple[int, ...],
        block: int,
        args: tuple,
        stream: int,
        shared_mem: int = 0,
    ) -> None:
        """Queue the kernel on ``stream`` (a raw handle) with ``shared_mem`` bytes of dynamic
        shared memory; ``grid``: blocks, or a tuple of up to three dimensions (x, y, z);
        ``args`` follow the signature."""
        launch = self._launch
        if launch is None:
            self._cupy_call(grid, block, args, shared_mem)
            return
        gx, gy, gz = (grid, 1, 1) if type(grid) is int else (*grid, 1, 1)[:3]
        buf, extra = self._packed()
        self._pack(buf, 0, *args)
        if self._launch_ex is not None:
            cfg = self._config()
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ, cfg.blockDimX = gx, gy, gz, block
            cfg.sharedMemBytes, cfg.hStream = shared_mem, stream
            rc = self._launch_ex(ctypes.byref(cfg), self._ptr, None, extra)
            if rc:
                raise RuntimeError(f"cuLaunchKernelEx failed with CUDA error {rc}")
            return
        rc = launch(self._ptr, gx, gy, gz, block, 1, 1, shared_mem, stream, None, extra)
        if rc:
            raise RuntimeError(f"cuLaunchKernel failed with CUDA error {rc}")

    def _cupy_call(
        self, grid: int | tuple[int, ...], block: int, args: tuple, shared_mem: int = 0
    ) -> None:
        import numpy as np

        conv = {"p": np.uint64, "q": np.int64, "d": np.float64, "i": np.int32, "f": np.float32}
        values = tuple(conv[c](a) for c, a in zip(self.signature, args))
        dims = (grid,) if type(grid) is int else tuple(grid)
        self.function(dims, (block,), values, shared_mem=shared_mem)
