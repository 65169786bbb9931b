"""Helper threads for MatMulNBits decode rows: a hand-off cheap enough for 100-us products.

``nn_cpu.parallel_rows`` hands chunks out under a Python condition and calls the loop
once a chunk, through a ``ThreadPoolExecutor`` (``submit`` alone is about 10 us); on the
loaded 2-core machine its hand-off cost 100-300 us a call, so it splits only products of
16M multiply-adds and more, and a decode step's [1, 896] x [896, 4864] projections (about
200 us from memory on one core) lost time split that way. Here the loop itself takes its
chunks from an atomic counter (``jit_nbits._drive_shared``): a helper is woken once a
call, by a ``queue.SimpleQueue`` put (under a microsecond), runs the compiled loop with
the GIL released until no chunk is left, and the caller never waits for it (it writes
again any chunk a helper took and has not finished). A helper that starts late finds
nothing to do and returns.

The threads are daemons, started on first use (one fewer than the cores); after a fork
the child starts its own (the parent's are gone there). No result depends on whether a
helper ran: each chunk's bits are the same whoever writes them.
"""

from __future__ import annotations

import os
import queue
import threading

_lock = threading.Lock()
_queues: list[queue.SimpleQueue] = []


def _serve(q: queue.SimpleQueue) -> None:
    while True:
        f, args = q.get()
        try:
            f(*args)
        except BaseException:  # noqa: BLE001 (the caller computes every chunk anyway)
            pass


def helpers(n: int) -> list[queue.SimpleQueue]:
    """The queues of ``n`` helper threads (started on first use)."""
    if len(_queues) < n:
        with _lock:
            while len(_queues) < n:
                q: queue.SimpleQueue = queue.SimpleQueue()
                threading.Thread(
                    target=_serve, args=(q,), name=f"onnxep-nbits-{len(_queues)}", daemon=True
                ).start()
                _queues.append(q)
    return _queues[:n]


def _forget() -> None:
    # the parent's threads do not exist in a forked child: its first call starts its own
    global _lock
    _lock = threading.Lock()
    _queues.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)


def run_shared(f, args: tuple, threads: int) -> None:
    """``f(*args, False)`` on ``threads - 1`` helpers, then ``f(*args, True)`` here.

    ``f`` is a ``jit_nbits`` shared driver: the call with True returns once every chunk
    is written (by whichever thread), without waiting for a helper."""
    for q in helpers(threads - 1):
        q.put((f, (*args, False)))
    f(*args, True)
