"""Dense float32 convolutions as direct sums with output channels in the vector (numba + llvmlite).

The compiled GEMM (``packed_gemm.py``, through ``conv_gemm.ConvGemm``) holds a tile of 6
output channels x 16 positions, positions in the vector. Its waste is in the shapes: the
channel counts CNNs use (16, 32, 64, 128) are multiples of 8, not 6 (16 channels: 18 rows
computed, 12.5% for nothing), and over whole padded rows a 20-wide map computes 22
columns, rounded up to 16 (a 10-wide one: 12 of 10). onnxruntime's MLAS (its NCHWc
kernels, ``snchwc.cpp``) puts 8 output channels in an AVX2 register instead and
broadcasts the input: no rounding of the channel count and no padded columns, the tile
runs along a row's real outputs. This module does the same from the NCHW input:

- a tile is ``fb`` blocks of 8 output channels (1 to 4) x ``12 // fb`` output positions of
  one row, ``fb * (12 // fb)`` accumulators in ymm registers; per kernel term (input
  channel, kernel row, kernel column) ``fb`` weight vectors, one broadcast input value a
  position and ``fb * P`` fused multiply-adds (the GEMM's 12 per term: FMA-bound alike);
- a broadcast reads any layout, so the input stays NCHW: the padded input (or its
  stride phase planes) is ``ConvGemm``'s, and term t of output (oh, ow) reads
  ``b[koff[t] + oh * wq + ow]`` as the GEMM's column does;
- the weights are packed once into (M / 8, K, 8) blocks; K runs in blocks whose weight
  slab stays in L1 (24 KB), partial sums between blocks in a channels-blocked scratch,
  the last block's sums stored straight into the NCHW output (lane by lane), Relu or Clip
  applied as they are stored;
- a row ends with a narrower tile (half or a quarter of the positions), masked: its
  missing positions recompute the row's last one and are not stored;
- work units (image, channel group, about an eighth of the rows) go to the threads; a
  unit's rows then take FusedConv's Z and the other compiled activations
  (``jit._conv_act``, the epilogue's own loop) while they are in cache.

Every output is its bias, then one fused multiply-add per kernel term in term order, as
in ``packed_gemm`` (whose K blocks also round nothing: the partial sums are float32 both
ways): the compiled GEMM's bits, on any thread split; a fused activation or Z gives the
unfused nodes' bits. Used for every dense float32 kernel larger than 1x1 with constant
weights (``applies``) but Winograd's wide 3x3 convolutions at one thread: the GEMM's,
im2col's and the smaller Winograd shapes' copies and transforms cost more.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from .. import jit
from ..openblas_core import cpu_family, cpu_flags
from . import conv_gemm
from .conv_gemm import PhasePlanes
from .nn_cpu import parallel_rows

#: FusedConv activations the kernel applies as it stores (the CPU kernels' bits)
ACTIVATIONS = {"Relu": 1, "Clip": 2}

__all__ = [
    "ACTIVATIONS", "DirectConv", "applies", "enabled", "fits_cpu", "pack_blocks", "session_notes",
    "status",
]  # fmt: skip

# ``ONNXEP_CPU_CONV_DIRECT``: ``auto`` (default: the rule in ``applies``), ``1`` every
# shape the kernel takes, at any thread count (tests, A/B measurements), ``0`` never.
MODE = os.environ.get("ONNXEP_CPU_CONV_DIRECT", "auto").strip().lower()

# Every shape runs here but, at one thread, the convolutions Winograd takes with at least
# this many input and output channels: there its 16/36 of the multiply-adds, in products
# long enough for OpenBLAS's full rate, win (128 -> 128 3x3 at 20x20: 1.24 ms against 1.49
# here; at 64 -> 64 40x40 1.80 against 1.51, 16 -> 16 160x160 4.30 against 1.74:
# docs/cpu_kernels.md).
_WINOGRAD_CHANNELS = 128
# On an AVX-512 CPU (Zen 4 here) Winograd's products run OpenBLAS's AVX-512 kernels and win
# from fewer channels: 96 -> 96 at 52x52 3.1-3.2 ms against 4.7-5.3 here, at 26x26 0.72
# against 1.1-1.6; 64 -> 64 at 40x40 the same (1.30 against 1.22-1.31)
_WINOGRAD_CHANNELS_AVX512 = 96


@functools.cache
def winograd_bound() -> int:
    """The fewest channels (min of C, M) of the one-thread 3x3 convolutions Winograd keeps."""
    flags = cpu_flags()
    return _WINOGRAD_CHANNELS_AVX512 if flags and "avx512f" in flags else _WINOGRAD_CHANNELS


# Tiles run along one output row: on narrower outputs they hold too few sums to hide the
# FMA latency (a width-1 output, magika's (5, 1) conv: 4 sums a tile), where the GEMM's
# panels run across rows
_MIN_WIDTH = 4
_LANES = 8  # float32 in a ymm register: the AVX2 block (MLAS's NCHWc block there)
_MAX_FB = 4
# AVX-512VL (Zen 4 here): 32 ymm registers, wider tiles (``ACCUMULATORS``) and slabs
_WIDE = (cpu_flags() or frozenset()) >= {"avx512f", "avx512vl"}
# Weight bytes of one K block of a tile (fb blocks x KC terms x 32 bytes): 3/4 of Zen 3's
# L1D (16 KB split 3x3 convs of 16 channels into two blocks and a round trip of the sums).
# On Zen 4 96 KB (from its 1 MB L2, streamed in order) was 1-3% faster than 24 KB on
# convs of K 576-1152 (one K block, no partial sums' round trips); read when planned.
_SLAB = (96 if _WIDE else 24) << 10


# AMD's family 0x19 (Zen 3 and Zen 4): 256-bit FMA units. Zen 4 has AVX-512 but runs a
# 512-bit FMA as two halves, so the GEMM's 16-float tiles multiply no faster than these
# 8-float ones, and at one thread the convolutions this kernel takes ran on OpenBLAS or
# Winograd there (small ResNet 2.6-2.8x onnxruntime, 1.65 with this kernel: docs/cpu_kernels.md,
# "convrows"). Zen 5 (0x1a) and Intel's AVX-512 cores have 512-bit FMA paths: not here.
_HALF_WIDTH_AVX512 = frozenset({("AuthenticAMD", 0x19)})


def fits_cpu(flags: frozenset[str] | None, family: tuple[str, int] | None) -> bool:
    """Whether a CPU of these /proc/cpuinfo ``flags`` and (vendor, family) runs the kernel:
    AVX2 and FMA, with no AVX-512 or AVX-512 on 256-bit FMA units (the tile is 8-float
    vectors: where the FMA path is 512 bits wide the GEMM's 16-float one is wider)."""
    if flags is None or not {"avx2", "fma"} <= flags:
        return False
    return "avx512f" not in flags or family in _HALF_WIDTH_AVX512


@functools.cache
def _avx2_cpu() -> bool:
    """``fits_cpu`` for this CPU, /proc/cpuinfo read once."""
    return fits_cpu(cpu_flags(), cpu_family())


def enabled() -> bool:
    """Whether convolutions may run here in this process: numba, and an AVX2 CPU (any
    CPU with ``ONNXEP_CPU_CONV_DIRECT=1``)."""
    if MODE == "0" or not jit.ENABLED:
        return False
    return MODE == "1" or _avx2_cpu()


def status() -> str:
    """One line for ``onnxep providers`` (imports nothing)."""
    if MODE == "0":
        return "direct Conv: off (ONNXEP_CPU_CONV_DIRECT=0)"
    if conv_gemm.jit_off():
        return "direct Conv: off (no compiled loops)"
    if MODE != "1" and not _avx2_cpu():
        return "direct Conv: off (not an AVX2 CPU with 256-bit FMA units)"
    return (
        "direct Conv: dense float32 kernels larger than 1x1 as direct sums, 8 output "
        "channels a vector, but for Winograd's 3x3 convolutions of "
        f"{winograd_bound()} channels or more at one thread"
        + (" (ONNXEP_CPU_CONV_DIRECT=1)" if MODE == "1" else "")
    )


def session_notes() -> tuple[str, ...]:
    """The status line for a session's notes where the kernel may run."""
    return (status(),) if enabled() else ()


def applies(k, group: int, m: int, ck: int, lsz: int, dtype, const_weights: bool,
            pointwise: bool, threads: int, winograd_channels: int = 0,
            out_w: int = _MIN_WIDTH) -> bool:  # fmt: skip
    """Whether a 2-D convolution of this shape runs here (shape, dtype, the session's
    thread count); ``winograd_channels``: min(C, M) where the Winograd path would take
    it, else 0; ``out_w``: the output's width."""
    if not (
        len(k) == 2
        and out_w >= _MIN_WIDTH
        and not pointwise
        and math.prod(k) > 1
        and group == 1
        and const_weights
        and np.dtype(dtype) == np.float32
        and m >= 1
        and ck >= 1
        and enabled()
    ):
        return False
    if MODE == "1":
        return True
    # Every thread count alike, but for Winograd's own shapes (one thread only): a route
    # that changed with the count changed the bits between a session the thread policy
    # gives two threads and one it gives one (a FusedConv-only model against its unfused
    # Conv + activation)
    return winograd_channels < winograd_bound()


# Accumulators (ymm sums) a tile may hold: 12 of AVX2's 16 registers, beside one term's
# weights and values. AVX-512VL gives 32 ymm registers (EVEX ymm16-31): up to 24 sums
# there, which halve the tile's fixed costs per multiply-add (its sums' loads and lane
# stores, the weights' loads, the koff load and the loop a term). Read when a convolution
# is planned (``DirectConv``).
ACCUMULATORS = 24 if _WIDE else 12
_NACCS = (12, 24)  # the tile sets compiled


def positions(fb: int, nacc: int = 12) -> int:
    """Output positions a tile of ``fb`` channel blocks holds with at most ``nacc``
    accumulators: 12 // fb, but 6 for four blocks where ``nacc`` allows 24 sums.

    Only four blocks widen (on Zen 4, 6-11% faster than 4 x 3): each position's index
    (clamped to ``rem``) is an integer register across the term loop, and the tiles of 12
    and 24 positions (2 x 12, 1 x 24 sums) spilled on x86's 16 (1.3-1.6x slower than the
    12-sum tiles); 3 x 6 ran 2-5% slower than 3 x 4 (docs/cpu_kernels.md, "nude")."""
    return 6 if fb == _MAX_FB and nacc >= 24 else 12 // fb


def k_block(fb: int, slab: int | None = None) -> int:
    return (_SLAB if slab is None else slab) // (fb * _LANES * 4)


def pack_blocks(w: np.ndarray) -> tuple[np.ndarray, int]:
    """(M, C, *kernel) weights to (ceil(M / 8), K, 8) float32 blocks (zero channels past
    M), flat, and K."""
    m = w.shape[0]
    a = np.asarray(w, dtype=np.float32).reshape(m, -1)
    k = a.shape[1]
    mb = -(-m // _LANES)
    p = np.zeros((mb * _LANES, k), np.float32)
    p[:m] = a
    return np.ascontiguousarray(p.reshape(mb, _LANES, k).transpose(0, 2, 1)).reshape(-1), k


class DirectConv(PhasePlanes):
    """One input shape's convolution: its phase planes, the partial sums' scratch, the
    work units; ``__call__(x, y)`` writes the (N, M, oh * ow) result into ``y``."""

    def __init__(
        self, xshape, wblocks, k_terms, bias, k, strides, dil, pb, pe, out, act=(0, 0.0, 0.0),
        post=(0, None),
    ):  # fmt: skip
        oh, ow = out
        # (code, lo, hi): 1 Relu, 2 Clip(lo, hi) on the stored sums (``ACTIVATIONS``), 0 none
        self.act = (int(act[0]), np.float32(act[1]), np.float32(act[2]))
        # (code, prm): another compiled activation (``jit._conv_act``'s codes and constants,
        # ``conv_epilogue``'s) over a work unit's rows as soon as they are done, in cache
        # and on the unit's thread; 0: none
        prm = post[1] if post[1] is not None else np.zeros(1, np.float32)
        self.post = (int(post[0]), np.ascontiguousarray(prm, dtype=np.float32))
        super().__init__(xshape, k, strides, dil, pb, pe, out, ow)
        self.wb = wblocks
        self.kt = k_terms
        self.m = m = bias.shape[0]
        nblocks = -(-m // _LANES)
        self.bias = np.zeros(nblocks * _LANES, np.float32)
        self.bias[:m] = bias
        groups = -(-nblocks // _MAX_FB)
        # the slab as K terms of one channel block and the tiles' sums, read when planned
        self.slab_terms = _SLAB // (_LANES * 4)
        self.nacc = ACCUMULATORS
        # partial sums between K blocks, only where there is more than one
        many = any(
            k_terms > k_block((g + 1) * nblocks // groups - g * nblocks // groups, _SLAB)
            for g in range(groups)
        )
        n = xshape[0]
        # one set of planes and of partial sums an image: the work units of every image go
        # to the threads at once (image by image, a batch paid a hand-off an image)
        self.bsize = self.b.shape[0]
        self.b = np.concatenate([self.b] * max(n, 1))
        self.accsize = nblocks * _LANES * oh * ow if many else 1
        self.acc = np.empty(self.accsize * max(n, 1), np.float32)
        # rows per work unit: about 8 units a channel group, each at least one row
        self.rows = max(1, -(-oh // 8))
        self.units = groups * (-(-oh // self.rows))
        self.run = jit_direct()
        self.fill_jit = _compiled["fill"]
        self.work = n * m * k_terms * oh * ow

    def __call__(self, x: np.ndarray, y: np.ndarray, z: np.ndarray | None = None) -> None:
        """``y`` (N, M, oh * ow) = the convolution of ``x``, plus ``z`` (float32, ``y``'s
        layout, C-contiguous) when given, before the activation."""
        n, c, h, w = x.shape
        if n == 0:
            return
        oh, ow = self.out
        fill, table, (sh, sw, wq, cs) = self.fill_jit, self.table, self.geo
        xs = x.reshape(n, c * h * w) if x.flags.c_contiguous else x.reshape(n, -1).copy()
        b, bsize = self.b, self.bsize
        for i in range(n):
            fill(xs[i], c, h, w, b[i * bsize : (i + 1) * bsize], table, sh, sw, wq, cs)
        run, yf = self.run, y.reshape(-1)
        args = (self.wb, self.kt, self.bias, b, bsize, self.koff, wq, oh, ow, self.acc,
                self.accsize, yf, self.m, self.rows, self.units, self.slab_terms,
                self.nacc)  # fmt: skip
        zf = _NO_Z if z is None else z.reshape(-1)
        act = (*self.act, *self.post, zf, z is not None)
        parallel_rows(n * self.units, self.work, lambda u0, u1: run(*args, u0, u1, *act))


_compiled: dict[str, Any] = {}
_LITTLE_ENDIAN = sys.byteorder == "little"
_NO_Z = np.zeros(1, np.float32)


def sizes(fb: int, nacc: int = 12) -> tuple[int, ...]:
    """The tile widths (positions) for ``fb`` channel blocks and ``nacc`` sums: the full
    tile and two narrower ones for a row's last positions (a masked full tile there
    computed up to 11 positions for one: 13-wide maps of 8 channels ran at half speed), and
    for 6-wide tiles one of 4 (40- and 10-wide maps end 4 positions past a multiple of 6:
    64 -> 64 at 40x40 1.12 -> 1.07 ms, 128 -> 128 at 10x10 0.32 -> 0.27 on Zen 4)."""
    full = positions(fb, nacc)
    four = {4} if full == 6 else set()
    return tuple(sorted({full, -(-full // 2), -(-full // 4)} | four, reverse=True))


def jit_direct() -> Any:
    """The compiled ``run(wb, K, bias, b, bsize, koff, wq, oh, ow, acc, accsize, y, m, rows,
    upi, slab, nacc, u0, u1, act, lo, hi, post, prm, z, has_z)``: work units [u0, u1) of
    (image, channel group, ``rows`` output rows), ``upi`` units an image (K blocks of
    ``slab // fb`` terms, tiles of ``positions(fb, nacc)``); image i's planes at
    ``b[i bsize:]``, its partial sums at ``acc[i accsize:]``, its output at ``y[i M oh
    ow:]``; ``z`` (``y``'s layout) added to each unit's rows when ``has_z``, then the
    ``post`` activation."""
    f = _compiled.get("direct")
    if f is None:
        if not jit.ENABLED:
            raise RuntimeError("the direct Conv needs numba")
        g = globals()
        jit.loop("conv_epilogue")  # compiles jit's helpers, ``_conv_act`` among them
        g["_conv_act"] = vars(jit)["_conv_act"]
        for fb in range(1, _MAX_FB + 1):
            for p in sorted({p for nacc in _NACCS for p in sizes(fb, nacc)}):
                g[f"_t{fb}_{p}"] = _make_tile(fb, p)
        _direct.__qualname__ = f"_direct_{source_digest()}"
        f = _compiled["direct"] = jit.nb.njit(cache=True, nogil=True, boundscheck=False)(_direct)
        _compiled["fill"] = jit.nb.njit(cache=True, nogil=True, boundscheck=False)(_fill)
    return f


def _fill(xf, c, h, w, b, table, sh, sw, wq, cs):
    """One image (C, H, W), flat, into its phase planes (``PhasePlanes.table``). NumPy's
    copy of each strided view cost 3 us of dispatch a plane on small maps; unsigned
    indices, as numba tests signed ones for wraparound on every access (3x slower)."""
    u = np.uint64
    # Column stride 2 on even widths: every row starts at an even index, so the row's
    # values are read as 64-bit pairs, the phase's one the low (x0 = 0) or high half,
    # moved as bits (NaN payloads kept). LLVM made the stride-2 read a gather (scalar
    # loads on AVX2, slow gathers on Zen 4: 16 x 160 x 160 177 -> 64 us here).
    paired = sw == 2 and w % 2 == 0 and _LITTLE_ENDIAN  # the first value is the low half
    pairs = xf.view(np.uint64) if paired else xf[:0].view(np.uint64)
    bu = b.view(np.uint32)
    # channel by channel: a channel's plane is read once per phase while it is in cache
    # (phase by phase over the whole input: 4x its traffic from L3 for stride 2)
    for ch in range(c):
        for t in range(table.shape[0]):
            d0, y0, x0 = u(table[t, 0]), u(table[t, 3]), u(table[t, 4])
            ny, nx = table[t, 1], table[t, 2]
            for i in range(ny):
                d = d0 + u(ch * cs + i * wq)
                src = u(ch * h * w) + (y0 + u(i * sh)) * u(w) + x0
                if sw == 1:
                    for j in range(nx):
                        b[d + u(j)] = xf[src + u(j)]
                elif paired:
                    p0 = (src - x0) >> u(1)
                    half = u(32) * x0
                    for j in range(nx):
                        bu[d + u(j)] = np.uint32(pairs[p0 + u(j)] >> half)
                else:
                    for j in range(nx):
                        b[d + u(j)] = xf[src + u(j * sw)]


def _direct(
    wb, K, bias, b, bsize, koff, wq, oh, ow, acc, accsize, y, m, rows, upi, slab, nacc, u0, u1, act,
    lo, hi, post, prm, z, has_z,
):  # fmt: skip
    nblocks = (m + 7) // 8
    ngroups = (nblocks + 3) // 4
    nrb = (oh + rows - 1) // rows
    ys = oh * ow
    q = np.empty(_NQ, np.int64)  # the tile's integer arguments (``_make_tile``)
    q[_WBS] = K * 8
    q[_YS] = ys
    q[_ACT] = act
    for ui in range(u0, u1):
        img = ui // upi  # units per image
        u = ui % upi
        grp = u // nrb
        r0 = (u % nrb) * rows
        r1 = min(oh, r0 + rows)
        # groups of channel blocks as even as they go (5 blocks: 2 + 3, not 4 + 1)
        mb0 = grp * nblocks // ngroups
        fb = (grp + 1) * nblocks // ngroups - mb0
        bo = mb0 * 8
        q[_BOFF] = bo
        q[_MVALID] = m - bo
        full = 6 if fb == 4 and nacc >= 24 else 12 // fb  # positions(fb, nacc)
        half = (full + 1) // 2
        quarter = (full + 3) // 4
        # K blocks of at most a weight slab (``slab`` terms of one block: k_block), as even
        # as they go
        kmax = slab // fb
        nk = (K + kmax - 1) // kmax
        kc_max = (K + nk - 1) // nk
        aoff0 = img * accsize + bo * ys
        yimg = img * m * ys
        bimg = img * bsize
        for k0 in range(0, K, kc_max):
            kc = min(kc_max, K - k0)
            q[_K0] = k0
            q[_KC] = kc
            q[_FIRST] = 1 if k0 == 0 else 0
            q[_LAST] = 1 if k0 + kc >= K else 0
            q[_WOFF] = bo * K + k0 * 8
            for r in range(r0, r1):
                c0 = 0
                while c0 < ow:
                    rem = ow - c0
                    tw = full
                    if rem <= quarter:
                        tw = quarter
                    elif rem <= half:
                        tw = half
                    elif rem == 4 and full == 6:  # sizes(): exact, not 6 with 2 wasted
                        tw = 4
                    pos = r * ow + c0
                    q[_XB] = bimg + r * wq + c0
                    q[_REM] = min(rem, tw)
                    q[_AOFF] = aoff0 + pos * fb * 8
                    q[_YOFF] = yimg + bo * ys + pos
                    if fb == 1 and tw == 12:
                        _t1_12(wb, b, koff, bias, acc, y, q, lo, hi)
                    elif fb == 1 and tw == 6:
                        _t1_6(wb, b, koff, bias, acc, y, q, lo, hi)
                    elif fb == 1 and tw == 3:
                        _t1_3(wb, b, koff, bias, acc, y, q, lo, hi)
                    elif fb == 2 and tw == 4:
                        _t2_4(wb, b, koff, bias, acc, y, q, lo, hi)
                    elif fb == 2 and tw == 6:
                        _t2_6(wb, b, koff, bias, acc, y, q, lo, hi)
                    elif fb == 2 and tw == 3:
                        _t2_3(wb, b, koff, bias, acc, y, q, lo, hi)
                    elif fb == 2 and tw == 2:
                        _t2_2(wb, b, koff, bias, acc, y, q, lo, hi)
                    elif fb == 3 and tw == 4:
                        _t3_4(wb, b, koff, bias, acc, y, q, lo, hi)
                    elif fb == 3 and tw == 2:
                        _t3_2(wb, b, koff, bias, acc, y, q, lo, hi)
                    elif fb == 3 and tw == 1:
                        _t3_1(wb, b, koff, bias, acc, y, q, lo, hi)
                    elif fb == 4 and tw == 6:
                        _t4_6(wb, b, koff, bias, acc, y, q, lo, hi)
                    elif fb == 4 and tw == 4:
                        _t4_4(wb, b, koff, bias, acc, y, q, lo, hi)
                    elif fb == 4 and tw == 3:
                        _t4_3(wb, b, koff, bias, acc, y, q, lo, hi)
                    elif fb == 4 and tw == 2:
                        _t4_2(wb, b, koff, bias, acc, y, q, lo, hi)
                    elif fb == 4 and tw == 1:
                        _t4_1(wb, b, koff, bias, acc, y, q, lo, hi)
                    c0 += tw
        if post != 0 or has_z:
            # a channel's rows r0..r1 are one run of the NCHW output
            for ch in range(bo, min(m, bo + fb * 8)):
                s0 = yimg + ch * ys + r0 * ow
                seg = y[s0 : s0 + (r1 - r0) * ow]
                if has_z:  # FusedConv's Z, before the activation (the Add node's sum)
                    zs = z[s0 : s0 + (r1 - r0) * ow]
                    if post == 1:
                        # and Relu in the same pass, as a select LLVM vectorises (the
                        # Relu kernel's: v unless not (v > 0 or v is NaN))
                        zero = prm[4]
                        for j in range(seg.shape[0]):
                            v = seg[j] + zs[j]
                            seg[j] = v if (v > zero or v != v) else zero
                        continue
                    for j in range(seg.shape[0]):
                        seg[j] = seg[j] + zs[j]
                if post != 0:
                    _conv_act(seg, post, prm)


#: The tile's integer arguments, in its ``q`` array (int64): see ``_make_tile``
_QNAMES = (
    "woff", "wbs", "k0", "kc", "xb", "rem", "boff", "aoff", "first", "last", "yoff", "ys",
    "mvalid", "act",
)  # fmt: skip
(_WOFF, _WBS, _K0, _KC, _XB, _REM, _BOFF, _AOFF, _FIRST, _LAST, _YOFF, _YS, _MVALID,
 _ACT) = range(len(_QNAMES))  # fmt: skip
_NQ = len(_QNAMES)


def _no_tile(*args):  # the intrinsics replace these before ``_direct`` is compiled
    raise NotImplementedError


# jit's compiled helper, set before ``_direct`` is compiled. numba's disk cache keys
# ``_direct`` on this file alone, so its cache name carries ``source_digest``.
_conv_act = _no_tile


def source_digest() -> str:
    """A digest of the other sources compiled into ``_direct``: jit.py (``_conv_act``) and
    packed_gemm.py (the tiles' ``vector_codegen``); an edit there is never answered from a
    stale disk-cache entry."""
    from . import packed_gemm

    h = hashlib.sha256(jit.source_digest().encode())
    h.update(Path(packed_gemm.__file__).read_bytes())
    return h.hexdigest()[:16]


_t1_12 = _t1_6 = _t1_3 = _t2_6 = _t2_3 = _t2_2 = _no_tile
_t3_4 = _t3_2 = _t3_1 = _t4_6 = _t4_4 = _t2_4 = _t4_3 = _t4_2 = _t4_1 = _no_tile


def _make_tile(fb: int, npos: int) -> Any:
    """``tile(wb, b, koff, bias, acc, y, q, lo, hi)``, a numba intrinsic (the integers
    woff, wbs, k0, kc, xb, rem, boff, aoff, first, last, yoff, ys, mvalid, act in ``q``)
    over ``fb`` channel blocks x P = ``npos`` positions: for block f, lane l, position p < rem,

        s = bias[boff + 8 f + l] (first) or acc[aoff + (p fb + f) 8 + l]
        s = fma(wb[woff + f wbs + 8 t + l], b[koff[k0 + t] + xb + p], s), t = 0 .. kc-1

    then ``y[yoff + (8 f + l) ys + p] = s`` for 8 f + l < mvalid (last), else
    ``acc[...] = s``. Positions p >= rem compute position rem - 1 again and store nothing.
    """
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    from .packed_gemm import vector_codegen

    vw = _LANES
    names = ("wb", "b", "koff", "bias", "acc", "y", "q", "lo", "hi")
    arrays = ("wb", "b", "koff", "bias", "acc", "y", "q")

    def codegen(context, builder, signature, args):
        val = dict(zip(names, args))
        ty = dict(zip(names, signature.args))
        arr = {n: context.make_array(ty[n])(context, builder, val[n]) for n in arrays}
        iv = {
            n: builder.load(builder.gep(arr["q"].data, [ir.Constant(ir.IntType(64), i)]))
            for i, n in enumerate(_QNAMES)
        }
        vty, fma, const, vptr = vector_codegen(builder, arr, vw)
        undef = ir.Constant(vty, ir.Undefined)
        lane0 = ir.Constant(ir.IntType(32), 0)
        splat = ir.Constant(ir.VectorType(ir.IntType(32), vw), [0] * vw)

        def broadcast(x):
            return builder.shuffle_vector(builder.insert_element(undef, x, lane0), undef, splat)

        last_p = builder.sub(iv["rem"], const(1))
        pidx = [
            builder.select(builder.icmp_signed("<", const(p), iv["rem"]), const(p), last_p)
            for p in range(npos)
        ]
        live = [builder.icmp_signed("<", const(p), iv["rem"]) for p in range(npos)]
        accs = [[cgutils.alloca_once(builder, vty) for _ in range(npos)] for _ in range(fb)]

        def acc_at(f, p):
            return builder.add(iv["aoff"], builder.mul(pidx[p], const(fb * vw)))

        first = builder.icmp_signed("!=", iv["first"], const(0))
        with builder.if_else(first) as (from_bias, from_acc):
            with from_bias:
                for f in range(fb):
                    v = builder.load(vptr("bias", builder.add(iv["boff"], const(vw * f))), align=4)
                    for p in range(npos):
                        builder.store(v, accs[f][p])
            with from_acc:
                for f in range(fb):
                    for p in range(npos):
                        at = builder.add(acc_at(f, p), const(vw * f))
                        builder.store(builder.load(vptr("acc", at), align=4), accs[f][p])
        wcol = [builder.add(iv["woff"], builder.mul(iv["wbs"], const(f))) for f in range(fb)]
        with cgutils.for_range(builder, iv["kc"]) as lp:
            kk = lp.index
            row = builder.load(builder.gep(arr["koff"].data, [builder.add(iv["k0"], kk)]))
            xo = builder.add(row, iv["xb"])
            t8 = builder.mul(kk, const(vw))

            def weight(f):
                return builder.load(vptr("wb", builder.add(wcol[f], t8)), align=4)

            def value(p):
                x = builder.load(builder.gep(arr["b"].data, [builder.add(xo, pidx[p])]))
                return broadcast(x)

            # Hold the smaller set of operands and stream the other, one term's worth of
            # registers beside the sums (loading all of both spilled sums to the stack)
            if fb <= npos:
                ws = [weight(f) for f in range(fb)]
                for p in range(npos):
                    x = value(p)
                    for f in range(fb):
                        a = accs[f][p]
                        builder.store(builder.call(fma, [ws[f], x, builder.load(a)]), a)
            else:
                xs = [value(p) for p in range(npos)]
                for f in range(fb):
                    wv = weight(f)
                    for p in range(npos):
                        a = accs[f][p]
                        builder.store(builder.call(fma, [wv, xs[p], builder.load(a)]), a)
        last = builder.icmp_signed("!=", iv["last"], const(0))
        fty = ir.FloatType()
        zero = ir.Constant(vty, [0.0] * vw)
        lo = broadcast(context.cast(builder, val["lo"], ty["lo"], types.float32))
        hi = broadcast(context.cast(builder, val["hi"], ty["hi"], types.float32))
        is_relu = builder.icmp_signed("==", iv["act"], const(1))
        is_clip = builder.icmp_signed("==", iv["act"], const(2))

        def activated(v):
            # Relu as the CPU kernel: v unless not (v > 0 or v is NaN) (-0 -> 0); Clip: lo
            # where v < lo, then hi where v > hi (NaN passes)
            relu = builder.select(builder.fcmp_unordered(">", v, zero), v, zero)
            c = builder.select(builder.fcmp_ordered("<", v, lo), lo, v)
            c = builder.select(builder.fcmp_ordered(">", c, hi), hi, c)
            return builder.select(is_relu, relu, builder.select(is_clip, c, v))

        def store_lanes(vals, f, guarded):
            for lane in range(vw):
                ch = vw * f + lane
                base = builder.add(iv["yoff"], builder.mul(iv["ys"], const(ch)))
                for p in range(npos):
                    v = builder.extract_element(vals[p], ir.Constant(ir.IntType(32), lane))
                    at = builder.gep(arr["y"].data, [builder.add(base, const(p))])
                    if guarded:
                        ok = builder.and_(
                            live[p], builder.icmp_signed("<", const(ch), iv["mvalid"])
                        )
                        with builder.if_then(ok, likely=True):
                            builder.store(v, at)
                    else:
                        builder.store(v, at)

        whole = builder.and_(
            builder.icmp_signed("==", iv["rem"], const(npos)),
            builder.icmp_signed(">=", iv["mvalid"], const(vw * fb)),
        )
        with builder.if_else(last) as (to_y, to_acc):
            with to_y:
                vals = [
                    [activated(builder.load(accs[f][p])) for p in range(npos)] for f in range(fb)
                ]
                # every lane and position kept: straight-line stores, no branch a value
                with builder.if_else(whole, likely=True) as (plain, guarded):
                    with plain:
                        for f in range(fb):
                            store_lanes(vals[f], f, False)
                    with guarded:
                        for f in range(fb):
                            store_lanes(vals[f], f, True)
            with to_acc:
                for f in range(fb):
                    for p in range(npos):
                        with builder.if_then(live[p], likely=True):
                            at = builder.add(acc_at(f, p), const(vw * f))
                            builder.store(builder.load(accs[f][p]), vptr("acc", at), align=4)
        del fty
        return context.get_dummy_value()

    def typer(typingctx, *sig):
        return types.void(*sig), codegen

    # numba's intrinsic needs named parameters: one per name above
    params = ", ".join(names)
    ns: dict = {"_typer": typer}
    exec(f"def typer(typingctx, {params}):\n    return _typer(typingctx, {params})", ns)
    return intrinsic(ns["typer"])
