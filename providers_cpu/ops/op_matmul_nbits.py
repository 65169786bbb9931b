"""com.microsoft MatMulNBits on the CPU: packed weights for decode rows, float32 for the rest.

A decode step multiplies one (or a few) rows of A by the whole weight: reading
float32 weights moves eight times the bytes of the 4-bit ones, so with numba
(``onnxep.providers_cpu.jit``) rows up to ``PACKED_ROWS`` run a loop over the
packed weights, split by output columns over the run's threads. At
``accuracy_level`` 4 it rounds A to int8 per block of K (``rint(a * 127 / amax)``,
as onnxruntime's CPU kernel and the generic kernel do) and sums each block's
products as integers, exactly, before scaling: for 4-bit weights on AVX2 in
``jit_nbits``' tiles (``vpmaddubsw``, the weight packed once into one stream; a large
weight's column groups shared with ``nbits_threads``' helpers), otherwise in
``jit._nbits_int``.

Longer inputs (prefill) run one BLAS GEMM against the float32 weight, made
once: at session creation when there is no packed loop, on the first such run
otherwise, and only when its size is at most ``ONNXEP_NBITS_FLOAT_MB``
(default 1024 MB per node). Past that, or with weights that are not constants,
each run dequantizes blocks of output columns and multiplies them one at a
time, holding at most ``CHUNK_BYTES`` of float weights.
"""

from __future__ import annotations

import os
import threading
from typing import NamedTuple

import numpy as np

from onnxep.errors import InvalidArgument, NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.ops import contrib as C

from .. import jit, jit_nbits
from ..threads import cpu_count, run_threads
from . import nbits_threads
from .nn_cpu import parallel_rows

#: Rows of A up to which the packed-weight loop runs (when numba is installed).
PACKED_ROWS = 8
CHUNK_BYTES = 64 << 20
PACKED_MIN_BYTES = 1 << 20


def float_limit() -> int:
    """Bytes of float32 weight a node may keep (``ONNXEP_NBITS_FLOAT_MB``, default 1024)."""
    raw = os.environ.get("ONNXEP_NBITS_FLOAT_MB", "1024").strip()
    try:
        mb = float(raw)
    except ValueError:
        raise NotSupported(
            f"ONNXEP_NBITS_FLOAT_MB must be a number of megabytes, got {raw!r}"
        ) from None
    return int(mb * (1 << 20))


@kernel("MatMulNBits", domain="com.microsoft", dtypes=("float", "float16", "bfloat16"))
def matmul_nbits(node, xp):
    k, n, bits, block_size, int8_a = C.nbits_attrs(node)
    kb = -(-k // block_size)
    qargs = dict(n=n, k=k, bits=bits, block_size=block_size, xp=np)
    consts = C.nbits_constants(node)
    static = consts is not None
    if static:
        b0, s0, zp0, gi0 = (None if c is None else np.asarray(c) for c in consts)
        static = b0.size != 0
    fits = static and n * k * 4 <= float_limit()
    packed = None
    if static and jit.ENABLED and bits in (4, 8) and gi0 is None:
        if zp0 is None or zp0.dtype == np.uint8:
            if int8_a and jit_nbits.usable(bits, block_size):
                packed = _tiled(b0, s0, zp0, n, kb, bits, block_size)
            else:
                packed = _pack(b0, s0, zp0, n, kb, bits, block_size)
    # A float32 weight this small stays in cache between decode steps, where BLAS reads
    # it faster than the portable loop unpacks 4 bits; a larger one comes from memory.
    # The AVX2 tiles beat BLAS at every size measured (a [1, 256] x [256, 256] node 43
    # against 49 us, run overhead included).
    big = n * k * 4 >= PACKED_MIN_BYTES or isinstance(packed, Tiled)
    wf: list = []  # the (K, N) float32 weight, once made
    lock = threading.Lock()

    def float_weight():
        if not wf:
            with lock:
                if not wf:
                    w = C.dequantize_nbits(b0, s0, zp0, gi0, dtype=np.float32, **qargs)
                    wf.append(np.ascontiguousarray(w.T))  # (K, N): BLAS reads it row-wise
        return wf[0]

    if fits and (packed is None or not big):
        float_weight()  # at session creation, as the weight's only form

    def run(a, b, scales, zero_points=None, g_idx=None, bias=None):
        out_shape = a.shape[:-1] + (n,)
        if b.size == 0:
            # An omitted projection: the output is the (broadcast) bias or zeros.
            y = np.zeros(out_shape, dtype=a.dtype)
            return (y if bias is None else C.down(y + bias, a.dtype),)
        if a.shape[-1] != k:
            raise InvalidArgument(f"MatMulNBits: A's last dimension is {a.shape[-1]}, K is {k}")
        a2 = a.reshape(-1, k)
        if packed is not None and a2.shape[0] <= PACKED_ROWS and (big or not fits):
            y = packed_matmul(a2, packed, n, kb, bits, block_size, int8_a)
        else:
            af = int8_round(a2, kb, block_size) if int8_a else C.up(a2, np, np.float32)
            if fits:
                y = af @ float_weight()
            else:
                y = _chunked(af, b, scales, zero_points, g_idx, qargs, n, k)
        y = y.reshape(out_shape)
        if bias is not None:
            y = y + C.up(bias, np, y.dtype)
        return (C.down(y, a.dtype),)

    return run


def _pack(b, scales, zp, n, kb, bits, block_size):
    """(packed (KB, blob, N) uint8, scales (KB, N) float32, zero points (KB, N) float32).

    Transposed, so the compiled loops' innermost loop runs over contiguous output columns.
    """
    blob = block_size * bits // 8
    if b.size != n * kb * blob:
        raise NotSupported(
            f"MatMulNBits: B has {b.size} bytes, expected N * ceil(K / block_size) * "
            f"{blob} = {n * kb * blob}"
        )
    if scales.size < n * kb:
        raise NotSupported(f"MatMulNBits: scales has {scales.size} values, expected {n * kb}")
    p = np.ascontiguousarray(b.reshape(n, kb, blob).transpose(1, 2, 0))
    s = np.ascontiguousarray(scales.reshape(n, -1)[:, :kb].astype(np.float32).T)
    if zp is None:
        z = np.full((n, kb), float(1 << (bits - 1)), dtype=np.float32)
    else:
        z = C.unpack_bits(zp.reshape(n, -1), bits, np)
        if z.shape[1] < kb:
            raise NotSupported(
                f"MatMulNBits: zero_points hold {z.shape[1]} values a row, expected {kb}"
            )
        z = z[:, :kb].astype(np.float32)
    return p, s, np.ascontiguousarray(z.T)


class Tiled(NamedTuple):
    """The weight in jit_nbits' layout (4 bits, level 4, AVX2)."""

    p: np.ndarray  # jit_nbits.pack: (column groups, KB, record) uint8
    has_zp: bool


def _tiled(b, scales, zp, n, kb, bits, block_size):
    """B, its scales and zero points packed for jit_nbits' tiles, one stream a run."""
    blob = block_size * bits // 8
    if b.size != n * kb * blob:
        raise NotSupported(
            f"MatMulNBits: B has {b.size} bytes, expected N * ceil(K / block_size) * "
            f"{blob} = {n * kb * blob}"
        )
    if scales.size < n * kb:
        raise NotSupported(f"MatMulNBits: scales has {scales.size} values, expected {n * kb}")
    w = b.reshape(n, kb * blob)
    s = scales.reshape(n, -1)[:, :kb].astype(np.float32)
    z = None
    if zp is not None:
        z = C.unpack_bits(zp.reshape(n, -1), bits, np)
        if z.shape[1] < kb:
            raise NotSupported(
                f"MatMulNBits: zero_points hold {z.shape[1]} values a row, expected {kb}"
            )
        z = z[:, :kb].astype(np.uint8)
    return Tiled(jit_nbits.pack(w, s, z, block_size // 32), z is not None)


def _blocks(a2, kb, block_size):
    """(M, K) A as float32 (M, KB, block_size), K padded with zeros to whole blocks."""
    m, k = a2.shape
    af = a2.astype(np.float32, copy=False)
    pad = kb * block_size - k
    if pad:
        af = np.concatenate([af, np.zeros((m, pad), np.float32)], axis=1)
    return np.ascontiguousarray(af.reshape(m, kb, block_size))


def packed_matmul(a2, packed, n, kb, bits, block_size, int8_a):
    """(M, K) A times the packed weight: (M, N) float32, through the compiled loops."""
    m = a2.shape[0]
    out = np.empty((m, n), np.float32)
    if isinstance(packed, Tiled):
        _tiles(np.ascontiguousarray(a2, np.float32), packed, kb, block_size, out)
        return out
    blocks = _blocks(a2, kb, block_size)
    work = m * n * kb * block_size
    parts = 2 if bits == 4 else 1
    p, s, z = packed
    if int8_a:
        aq = np.empty((m, kb, parts, block_size // parts), np.int8)
        asc = np.empty((m, kb), np.float32)
        asum = np.empty((m, kb), np.float32)
        jit.loop("quantize_a")(blocks, aq, asc, asum)
        f = jit.loop("nbits_int")
        parallel_rows(n, work, lambda n0, n1: f(aq, asc, asum, p, s, z, n0, n1, out))
    else:
        # even and odd positions apart, as the low and high nibbles they meet
        a4 = np.ascontiguousarray(blocks.reshape(m, kb, -1, parts).transpose(0, 1, 3, 2))
        f = jit.loop("nbits_float")
        parallel_rows(n, work, lambda n0, n1: f(a4, p, s, z, n0, n1, out))
    return out


#: Weights (packed bytes) from which the tiles may share a run's column groups with the
#: helper threads (``nbits_threads``): below it the hand-off is a fair part of the product.
SHARED_MIN_BYTES = 1 << 20
#: A shared run's chunks: about this many packed bytes each (at least 4 a thread), few
#: enough that taking one is nothing, small enough that the chunk a late helper holds (the
#: caller writes it again) is little work.
SHARED_CHUNK_BYTES = 64 << 10


def _tiles(a2, packed, kb, block_size, out):
    """``out`` = A times the weight on jit_nbits' tiles, on one thread or shared."""
    p, subs, pairs = packed.p, block_size // 32, block_size == 32
    # more threads than cores only queue behind each other (parallel_rows' pool is capped so)
    n = min(run_threads(), cpu_count(), p.shape[0])
    if n <= 1 or p.nbytes < SHARED_MIN_BYTES:
        jit_nbits.loop("matvec", packed.has_zp, subs)(a2, p, kb, block_size, pairs, out)
        return
    aa, asg, asc = jit_nbits.loop("quantize_a")(a2, kb, block_size, pairs)
    chunks = min(p.shape[0], max(4 * n, p.nbytes // SHARED_CHUNK_BYTES))
    state = np.zeros(1 + chunks, np.int64)
    # a helper that finishes after this returns writes (the same bits) into mine, never out
    mine = np.empty_like(out)
    f = jit_nbits.loop("drive_shared", packed.has_zp, subs)
    nbits_threads.run_shared(f, (p, aa, asg, asc, state, chunks, mine), n)
    out[...] = mine


def int8_round(a2, kb, block_size):
    """A rounded to int8 steps per block of K (``contrib.int8_blocks``), one loop when compiled."""
    if not jit.ENABLED:
        return C.int8_blocks(a2, block_size, np)
    m, k = a2.shape
    out = np.empty((m, kb, block_size), np.float32)
    jit.loop("int8_round")(_blocks(a2, kb, block_size), out)
    out = out.reshape(m, -1)
    return out[:, :k] if k < kb * block_size else out


def _chunked(af, b, scales, zero_points, g_idx, qargs, n, k):
    """A times the weight dequantized ``CHUNK_BYTES`` of output columns at a time."""
    kb = -(-k // qargs["block_size"])
    b3 = b.reshape(n, kb, -1)
    s2 = scales.reshape(n, -1)
    z2 = None if zero_points is None else zero_points.reshape(n, -1)
    out = np.empty((af.shape[0], n), np.float32)
    step = max(1, CHUNK_BYTES // (4 * k))
    for n0 in range(0, n, step):
        n1 = min(n, n0 + step)
        part = dict(qargs, n=n1 - n0)
        w = C.dequantize_nbits(
            b3[n0:n1], s2[n0:n1], None if z2 is None else z2[n0:n1], g_idx, dtype=np.float32, **part
        )
        np.matmul(af, w.T, out=out[:, n0:n1])
    return out
