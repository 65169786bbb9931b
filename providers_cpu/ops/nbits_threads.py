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
import time

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


#: Every this many calls of a size, the way that is not the faster so far runs once, so
#: the choice follows the machine's load.
EXPLORE = 8
_ALPHA = 0.25  # weight of the newest call in each way's moving average
# size class (bit length of the weight's bytes) -> [calls, one thread s/B, shared s/B]
_pace: dict[int, list] = {}


def choose(nbytes: int) -> bool:
    """Whether this call should share its chunks with the helpers (else one thread).

    Two threads read a weight faster only when the second core is free and the memory
    has bandwidth to spare: on the shared 2-core test machine under load, a decode step
    of qwen2.5-0.5b ran 0.70-0.79x onnxruntime's time with its projections on one thread
    and 0.87-0.91x shared. Which way wins changes with the load, so each size of weight
    keeps both ways' moving average of seconds a byte and runs the faster, trying the
    other every ``EXPLORE`` calls. Only the time depends on it: the bits are the same."""
    st = _pace.get(nbytes.bit_length())
    if st is None:
        st = _pace[nbytes.bit_length()] = [0, None, None]
    st[0] += 1
    one, two = st[1], st[2]
    if one is None or two is None:
        return two is None
    best = two < one
    return (not best) if st[0] % EXPLORE == 0 else best


def record(nbytes: int, shared: bool, seconds: float) -> None:
    st = _pace[nbytes.bit_length()]
    i = 2 if shared else 1
    per = seconds / nbytes
    st[i] = per if st[i] is None else st[i] + _ALPHA * (per - st[i])


def clock() -> float:
    return time.perf_counter()
