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
_driver_lock = threading.Lock()


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


class Launcher:
    """One kernel, launched with arguments of a fixed signature (``"pppq"``...)."""

    def __init__(self, function: Any, signature: str, *, use_driver: bool = True) -> None:
        """``function``: a ``cupy.RawKernel`` (as ``nvrtc.function`` returns) or its loaded
        ``cupy.cuda.Function``, on the current device."""
        self.function = function
        self.signature = signature
        self._local = threading.local()
        self._launch = None
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
        self, grid: int, block: int, args: tuple, stream: int, shared_mem: int = 0
    ) -> None:
        """Queue the kernel on ``stream`` (a raw handle) with ``shared_mem`` bytes of dynamic
        shared memory; ``args`` follow the signature."""
        launch = self._launch
        if launch is None:
            self._cupy_call(grid, block, args, shared_mem)
            return
        buf, extra = self._packed()
        self._pack(buf, 0, *args)
        rc = launch(self._ptr, grid, 1, 1, block, 1, 1, shared_mem, stream, None, extra)
        if rc:
            raise RuntimeError(f"cuLaunchKernel failed with CUDA error {rc}")

    def _cupy_call(self, grid: int, block: int, args: tuple, shared_mem: int = 0) -> None:
        import numpy as np

        conv = {"p": np.uint64, "q": np.int64, "d": np.float64, "i": np.int32, "f": np.float32}
        values = tuple(conv[c](a) for c, a in zip(self.signature, args))
        self.function((grid,), (block,), values, shared_mem=shared_mem)
