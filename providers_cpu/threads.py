"""How many threads NumPy's BLAS may use during a CPU provider's runs.

The BLAS thread pool is one per process, so a session's thread count (its
``intra_op_num_threads``, or the count thread_policy.py chose for it) cannot be a
private setting: it is applied while at least one run with that count is in flight,
and a run that wants another count waits until those runs are done. Runs that want
the same count run concurrently, which is the common case (sessions of similar size,
or created with the same options). The previous setting is restored when the last
run ends, so NumPy code outside onnxep keeps the process's own BLAS threads.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, NamedTuple


class _Blas(NamedTuple):
    """One loaded BLAS library's thread count: how to read it and how to set it."""

    get: Callable[[], int]
    set: Callable[[int], Any]


_lock = threading.Lock()
_cond = threading.Condition(_lock)
_active = 0  # runs in flight under the applied limit
_applied: int | None = None  # the count those runs use
_saved: list[tuple[_Blas, int]] = []  # each BLAS library and its count before the first run
_libs: list[_Blas] | None = None  # the loaded BLAS libraries
_modules = 0  # len(sys.modules) when the libraries were scanned
_waiting = 0  # runs waiting for the runs in flight to end (they want another count)
_quiet = 0  # runs in flight (or waiting) that asked for no spinning after a split


def _blas_libs() -> list[_Blas]:
    global _libs, _modules
    # Scanned again only after an import, which may have loaded another BLAS (a kernel's
    # lazy scipy import brings scipy's own OpenBLAS); threadpoolctl's limiter would scan
    # its list on every run (8 us).
    if _libs is None or len(sys.modules) != _modules:
        from threadpoolctl import ThreadpoolController

        _modules = len(sys.modules)
        _libs = [_blas(c) for c in ThreadpoolController().select(user_api="blas").lib_controllers]
    return _libs


def _blas(lib: Any) -> _Blas:
    """OpenBLAS with its own thread pool: its exported get/set functions, called directly
    (a run sets and restores the count: through threadpoolctl's controller that was 8 us a
    run, as much as a small model's few ops; directly, under a microsecond). Any other
    library (OpenMP OpenBLAS, MKL, BLIS): threadpoolctl's controller."""
    if lib.internal_api == "openblas" and getattr(lib, "threading_layer", "") != "openmp":
        try:
            dll = ctypes.CDLL(lib.filepath)
        except OSError:
            dll = None
        for pre, suf in itertools.product(("", "scipy_"), ("", "64_", "_64")):
            get = getattr(dll, f"{pre}openblas_get_num_threads{suf}", None)
            put = getattr(dll, f"{pre}openblas_set_num_threads{suf}", None)
            if get is not None and put is not None:
                return _Blas(get, put)
    return _Blas(lib.get_num_threads, lambda n: _set_through_threadpoolctl(lib, n))


def _set_through_threadpoolctl(lib: Any, n: int) -> None:
    """Set the count from the calling thread (under ``_cond``).

    threadpoolctl (3.8) lets one thread at a time set OpenBLAS's count, the first that
    does while it lives, and ignores the others: after a run on the main thread, a run
    on a worker thread kept the old count, and for some shapes other bits than a serial
    run. Every set here is made under ``_cond``, so the runs' own sets never race: each
    takes control for its set and gives it up after, so the application's own
    threadpoolctl calls between runs still take effect.
    """
    release = getattr(lib, "clear_controlling_thread", None)
    if release is not None:
        release(force=True)
    lib.set_num_threads(n)
    if release is not None:
        release()


class blas_threads:  # noqa: N801 (a context manager used like a function)
    """BLAS uses ``n`` threads inside; concurrent holders of another count wait.

    A class rather than a generator context: it is entered on every run.
    """

    __slots__ = ("n", "spin")

    def __init__(self, n: int, spin: bool = True) -> None:
        self.n = n
        self.spin = spin  # False: splits in these runs leave no thread spinning after them

    def __enter__(self) -> None:
        global _active, _applied, _saved, _waiting, _quiet
        n = self.n
        # The lock is taken directly, not through the Condition's ``with``: this runs
        # twice per run, and a small model's run is a few microseconds.
        _lock.acquire()
        try:
            if not self.spin:
                _quiet += 1
            if _active and _applied == n:  # another run with this count is in flight
                _active += 1
                return
            while _active and _applied != n:
                _waiting += 1
                try:
                    _cond.wait()
                finally:
                    _waiting -= 1
            if not _active:
                saved = [(lib, lib.get()) for lib in _blas_libs()]
                for lib, had in saved:
                    if had != n:
                        lib.set(n)
                _saved = saved
                _applied = n
            _active += 1
        finally:
            _lock.release()

    def __exit__(self, *exc: object) -> None:
        global _active, _applied, _quiet
        _lock.acquire()
        try:
            if not self.spin:
                _quiet -= 1
            _active -= 1
            if not _active:
                n = self.n
                for lib, had in _saved:
                    if had != n:
                        lib.set(had)
                _applied = None
                if _waiting:
                    _cond.notify_all()
        finally:
            _lock.release()


def process_blas_threads() -> int:
    """The count BLAS has now, outside any run (the largest over its libraries)."""
    with _cond:
        if _active:
            return max(had for _, had in _saved) if _saved else cpu_count()
        counts = [lib.get() for lib in _blas_libs()]
    return max((c for c in counts if c), default=cpu_count())


def threadpoolctl_status() -> str:
    """For ``onnxep providers``: whether the thread count can be honoured here."""
    try:
        import threadpoolctl  # noqa: F401
    except ImportError:
        return "threadpoolctl missing: intra_op_num_threads cannot be honoured"
    return (
        "intra_op_num_threads honoured through threadpoolctl (BLAS threads; 0: one count "
        "per session, 1 or every core by its largest product, in placement() and explain)"
    )


def cpu_count() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def run_spins() -> bool:
    """Whether a split now may leave its helper threads polling for the next one: no run in
    flight asked them not to (``session.intra_op.allow_spinning`` = ``0``)."""
    return not _quiet


def run_threads() -> int:
    """Threads a kernel may split its work over now: the run's limit, else every core."""
    n = _applied
    return n if n else cpu_count()
