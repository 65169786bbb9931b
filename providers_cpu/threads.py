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
