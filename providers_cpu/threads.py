"""How many threads NumPy's BLAS may use during a CPU provider's runs.

The BLAS thread pool is one per process, so a session's ``intra_op_num_threads``
cannot be a private setting: it is applied (through threadpoolctl) while at least
one run with that count is in flight, and a run that wants another count waits
until those runs are done. Runs that want the same count run concurrently, which is
the common case (every session of a process created with the same options). The
previous setting is restored when the last run ends, so NumPy code outside onnxep
keeps the process's own BLAS threads.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

_cond = threading.Condition()
_active = 0  # runs in flight under the applied limit
_applied: int | None = None  # the count those runs use
_restore: Any = None  # threadpoolctl's limiter that restores the previous setting
_controller: Any = None


def _limit(n: int) -> Any:
    global _controller
    if _controller is None:
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController()  # scans the loaded libraries once
    return _controller.limit(limits=n, user_api="blas")


@contextlib.contextmanager
def blas_threads(n: int) -> Iterator[None]:
    """BLAS uses ``n`` threads inside; concurrent holders of another count wait."""
    global _active, _applied, _restore
    with _cond:
        while _active and _applied != n:
            _cond.wait()
        if not _active:
            _restore = _limit(n)
            _applied = n
        _active += 1
    try:
        yield
    finally:
        with _cond:
            _active -= 1
            if not _active:
                _restore.restore_original_limits()
                _restore, _applied = None, None
                _cond.notify_all()


def threadpoolctl_status() -> str:
    """For ``onnxep providers``: whether the thread count can be honoured here."""
    try:
        import threadpoolctl  # noqa: F401
    except ImportError:
        return "threadpoolctl missing: intra_op_num_threads cannot be honoured"
    return "intra_op_num_threads honoured through threadpoolctl (BLAS threads)"


def cpu_count() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def run_threads() -> int:
    """Threads a kernel may split its work over now: the run's limit, else every core."""
    n = _applied
    return n if n else cpu_count()


# A product below this many multiply-adds runs on one BLAS thread: waking BLAS's
# other threads for it costs more than they save, and on a machine whose cores are
# busy (other processes, other sessions) the even split waits for a descheduled
# thread, which made a small CNN 20x slower on two threads than on one.
SMALL_GEMM = 32 << 20
_blas_libs: list | None = None
_blas_lock = threading.Lock()


def _blas_controllers() -> list:
    global _blas_libs
    if _blas_libs is None:
        with _blas_lock:
            if _blas_libs is None:
                try:
                    from threadpoolctl import ThreadpoolController

                    found = ThreadpoolController().lib_controllers
                    _blas_libs = [c for c in found if c.user_api == "blas"]
                except Exception:  # no threadpoolctl: BLAS keeps its own policy
                    _blas_libs = []
    return _blas_libs


@contextlib.contextmanager
def blas_for(macs: int) -> Iterator[None]:
    """Inside, BLAS runs products of ``macs`` multiply-adds on one thread when that is small.

    A larger product keeps the run's count (``intra_op_num_threads``, else BLAS's
    own). The setting is process-wide for the call's duration (about a microsecond
    to switch); a concurrent product elsewhere may run single-threaded meanwhile,
    which changes its speed only, never a result.
    """
    if macs >= SMALL_GEMM:
        yield
        return
    libs = [(c, c.get_num_threads()) for c in _blas_controllers()]
    libs = [(c, n) for c, n in libs if n > 1]
    for c, _ in libs:
        c.set_num_threads(1)
    try:
        yield
    finally:
        for c, n in libs:
            c.set_num_threads(n)
