"""Splits of a compiled kernel's rows over spinning helper threads, chunks claimed natively.

``nn_cpu.parallel_rows`` hands a Python callable's chunks to a ``ThreadPoolExecutor``
worker asleep on a futex, and every chunk starts and ends in Python under the GIL: on the
loaded 2-core machine a split cost 100-300 us more than the work it saved, so only
products of 16.8M multiply-adds and up are split there ("Thread hand-offs" in
docs/cpu_kernels.md). Here the whole split runs in compiled code: a driver compiled per
kernel claims chunks with an atomic fetch-add and calls the kernel on them, on the caller
and on each helper; a helper polls a generation counter (acquire loads, ``pause`` between
reads, GIL released) for ``SPIN_US`` after each split before it sleeps, so the next
convolution of a run finds it awake; after a split made with ``spin=False`` (a session
with onnxruntime's ``session.intra_op.allow_spinning`` at ``0``) it sleeps at once.
The GIL is taken once per split a thread, not once a chunk, and the caller waits only for
chunks a helper has claimed (a busy flag set before each claim). ``bench/cpu_handoff.py``
measures it against the executor on a synthetic kernel, ``bench/cpu_handoff_ab.py`` on
corpus models.

The result does not depend on the split: each chunk's rows are the kernel's ``(r0, r1)``
call, whichever thread makes it. One split runs at a time; a split asked for while another
thread's is in flight returns False and its caller runs the kernel alone.
"""

from __future__ import annotations

import platform
import threading
import time
from typing import Any

import numpy as np

from . import jit

#: How long a helper polls for the next split after one (and a caller for a helper's
#: chunk) before it sleeps: a run's convolutions come tens of microseconds apart.
SPIN_US = 200.0

# ctl's slots, a cache line (8 int64) apart: the posted split's generation, its claim
# word, then per helper a busy flag and an asleep flag
_GEN, _CLAIM, _LINE = 0, 8, 8


def _slot_busy(h: int) -> int:
    return _LINE * (2 + 2 * h)


def _slot_asleep(h: int) -> int:
    return _LINE * (3 + 2 * h)


_prims: dict[str, Any] = {}


def _primitives() -> dict[str, Any]:
    """Atomic loads, stores and fetch-add on an int64 array element, ``pause``, and the
    compiled polls ``wait_changed`` and ``wait_zero`` (a plain load may be hoisted out of
    a loop that never stores)."""
    if _prims:
        return _prims
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    x86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")

    def _ptr(context, builder, sig, args):
        aryty = sig.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        return cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]])

    @intrinsic
    def load_acquire(typingctx, arr, idx):
        def codegen(context, builder, sig, args):
            return builder.load_atomic(_ptr(context, builder, sig, args), "acquire", 8)

        return types.int64(arr, types.intp), codegen

    @intrinsic
    def store_release(typingctx, arr, idx, v):
        def codegen(context, builder, sig, args):
            builder.store_atomic(args[2], _ptr(context, builder, sig, args), "release", 8)
            return context.get_dummy_value()

        return types.void(arr, types.intp, types.int64), codegen

    @intrinsic
    def compare_swap(typingctx, arr, idx, expected, new):
        def codegen(context, builder, sig, args):
            ptr = _ptr(context, builder, sig, args)
            pair = builder.cmpxchg(ptr, args[2], args[3], "acq_rel", "acquire")
            return builder.extract_value(pair, 0)

        return types.int64(arr, types.intp, types.int64, types.int64), codegen

    def claim(ctl, gen, chunks):
        # the claim word is (generation << 32) | next chunk: a helper that woke for an
        # earlier split finds another generation there and claims nothing of this one
        while True:
            v = load_acquire(ctl, _CLAIM)
            if (v >> 32) != gen or (v & 0xFFFFFFFF) >= chunks:
                return -1
            if compare_swap(ctl, _CLAIM, v, v + 1) == v:
                return v & 0xFFFFFFFF

    @intrinsic
    def pause(typingctx):
        def codegen(context, builder, sig, args):
            if x86:  # a spin-wait hint: frees the core's shared resources to its sibling
                fnty = ir.FunctionType(ir.VoidType(), [])
                fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.x86.sse2.pause")
                builder.call(fn, [])
            return context.get_dummy_value()

        return types.void(), codegen

    nb = jit.nb

    def wait_changed(ctl, slot, seen, iters):
        for _ in range(iters):
            v = load_acquire(ctl, slot)
            if v != seen:
                return v
            pause()
        return seen

    def wait_zero(ctl, slots, iters):
        for _ in range(iters):
            busy = 0
            for s in slots:
                busy |= load_acquire(ctl, s)
            if busy == 0:
                return True
            pause()
        return False

    _prims.update(
        load_acquire=load_acquire,
        store_release=store_release,
        claim=nb.njit(nogil=True, inline="always")(claim),
        pause=pause,
        wait_changed=nb.njit(nogil=True)(wait_changed),
        wait_zero=nb.njit(nogil=True)(wait_zero),
    )
    return _prims


_DRIVER = """
def drive(ctl, slot, gen, rows, chunks, step, {pre}{post}):
    while True:
        if slot >= 0:
            store_release(ctl, slot, 1)
        i = claim(ctl, gen, chunks)
        if i < 0:
            if slot >= 0:
                store_release(ctl, slot, 0)
            return
        kernel({pre}step * (rows * i // chunks), step * (rows * (i + 1) // chunks), {post})
        if slot >= 0:
            store_release(ctl, slot, 0)
"""
_drivers: dict[tuple, Any] = {}
_drivers_lock = threading.Lock()


def driver(kernel, npre: int, npost: int):
    """The compiled ``drive(ctl, slot, gen, rows, chunks, step, *pre, *post)`` for
    ``kernel(*pre, r0, r1, *post)``: claims split ``gen``'s chunks until none is left,
    ``slot`` its busy flag (-1 for
    the caller, which waits for the helpers' flags instead). ``step`` scales the rows
    into the kernel's units (the GEMM's columns per panel)."""
    key = (id(kernel), npre, npost)
    f = _drivers.get(key)
    if f is None:
        with _drivers_lock:
            f = _drivers.get(key)
            if f is None:
                p = _primitives()
                pre = "".join(f"a{i}, " for i in range(npre))
                post = "".join(f"b{i}, " for i in range(npost))
                scope = {"kernel": kernel, **{k: p[k] for k in ("store_release", "claim")}}
                exec(_DRIVER.format(pre=pre, post=post), scope)  # noqa: S102
                f = _drivers[key] = (jit.nb.njit(nogil=True)(scope["drive"]), kernel)
    return f[0]


class Pool:
    """``helpers`` spinning threads; ``split`` runs one kernel's chunks over them and the caller."""

    def __init__(self, helpers: int) -> None:
        p = _primitives()
        self.wait_changed, self.wait_zero = p["wait_changed"], p["wait_zero"]
        self.helpers = helpers
        self.ctl = np.zeros(_LINE * (2 + 2 * helpers), np.int64)
        self.busy_slots = np.array([_slot_busy(h) for h in range(helpers)], np.intp)
        self.job: tuple | None = None
        self.err: BaseException | None = None
        self.lock = threading.Lock()  # one split at a time
        self.cond = threading.Condition()
        self.iters = _calibrate(self.wait_changed)
        self.after = self.iters  # a helper's polls after the split it ran (0: sleep)
        for h in range(helpers):
            threading.Thread(
                target=self._helper, args=(h,), daemon=True, name=f"onnxep-split-{h}"
            ).start()

    def split(
        self, drive, rows: int, chunks: int, step: int, args: tuple, spin: bool = True
    ) -> bool:
        """``drive``'s chunks here and on the helpers; False (nothing run) when another
        thread's split holds the pool. ``spin``: whether the helpers poll for the next
        split for ``SPIN_US`` after this one, or sleep as soon as their chunks are done."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            ctl = self.ctl
            self.err = None
            self.after = self.iters if spin else 0
            gen = (int(ctl[_GEN]) + 1) & 0x7FFFFFFF
            self.job = (drive, gen, rows, chunks, step, args)
            ctl[_CLAIM] = gen << 32
            ctl[_GEN] = gen  # under the GIL, after the job: a helper reads the job after this
            if any(ctl[_slot_asleep(h)] for h in range(self.helpers)):
                with self.cond:
                    self.cond.notify_all()
            try:
                drive(ctl, -1, gen, rows, chunks, step, *args)
            finally:
                ctl[_CLAIM] = -1  # on an error here: no helper claims another chunk
                while not self.wait_zero(ctl, self.busy_slots, self.iters):
                    time.sleep(0)  # a helper descheduled mid-chunk: let it have the core
                self.job = None
            if self.err is not None:
                raise self.err
        finally:
            self.lock.release()
        return True

    def _helper(self, h: int) -> None:
        ctl, busy, asleep = self.ctl, _slot_busy(h), _slot_asleep(h)
        seen = int(ctl[_GEN])
        while True:
            gen = self.wait_changed(ctl, _GEN, seen, self.after)
            if gen == seen:
                with self.cond:
                    ctl[asleep] = 1
                    while ctl[_GEN] == seen:
                        self.cond.wait()
                    ctl[asleep] = 0
                gen = int(ctl[_GEN])
            seen = gen
            job = self.job
            if job is None:
                continue
            drive, gen, rows, chunks, step, args = job
            try:
                drive(ctl, busy, gen, rows, chunks, step, *args)
            except BaseException as e:  # handed to the caller, which raises it
                self.err = self.err or e
                ctl[_CLAIM] = -1
                ctl[busy] = 0


def _calibrate(wait_changed) -> int:
    """Poll iterations in ``SPIN_US`` (a ``pause`` takes 10-140 cycles by CPU)."""
    probe = np.zeros(1, np.int64)
    n = 20000
    wait_changed(probe, 0, 0, 10)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        wait_changed(probe, 0, 0, n)
        best = min(best, time.perf_counter() - t0)
    return max(1, int(n * SPIN_US * 1e-6 / max(best, 1e-9)))


_pool: Pool | None = None
_pool_lock = threading.Lock()


def pool(helpers: int) -> Pool:
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = Pool(helpers)
    return _pool
