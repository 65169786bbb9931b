"""com.microsoft MatMulNBits on CUDA: A @ dequantize(B).T (+ bias) with 2-, 4- or 8-bit weights.

Decode (up to 8 rows of A) runs one fused dequantise-GEMV launch: on the tensor
cores for 4-bit weights with float16 activations, or float32 ones rounded to int8
(``accuracy_level=4``), where their staged rows fit (``nbits_mma_cuda``), else
``nbits_cuda``'s (K split across blocks inside it); a few more rows run ``nbits_cuda``'s
once per 8 rows, up to :func:`gemv_rows`; beyond, a prefill dequantises the weight once
per call, a tile of at most ``GEMM_TILE_BYTES`` at a time, into scratch from the session's
pool (freed when the call ends: no dequantised copy outlives a call, the point of a 4-bit
weight being its memory) and multiplies each tile with one cuBLAS GEMM
(``providers_cuda.blas``) that writes its columns of the output in place, the bias
added in the GEMM's float32 epilogue (beta = 1 over the broadcast bias). The weight,
scales and zero points must be constant initializers, checked once here, at session
creation, and read from the session's device copies where their layout suits the
kernels, else repacked once (``nbits_weights``); a decode step costs one launch and
reads each weight byte once. Numerics follow the CPU kernel: float32 accumulation,
zero points subtracted exactly, and with ``accuracy_level=4`` the activations rounded
to int8 per block of K first, with the CPU's arithmetic (the rounded activations match
bit for bit).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import nbits_cuda as K_
from . import nbits_mma_cuda as MMA
from .nbits_weights import Weights, fail
from .quant_cuda import ctype_of, sm_count
from .reduce_cuda import all_aligned

_log = logging.getLogger("onnxep.cuda.matmul_nbits")

#: Largest dequantised weight tile the prefill path holds at once (bytes).
GEMM_TILE_BYTES = 64 * 1024 * 1024
#: Rows a tile that splits N is a multiple of (see :func:`gemm_tile`).
GEMM_TILE_ALIGN = 128
#: Whether the nodes it takes run the tensor-core GEMV (tests and benchmarks turn it off to
#: run ``nbits_cuda``'s on the same nodes).
MMA_GEMV = True
#: Share of the device's copy bandwidth the GEMV reaches on a weight it streams (measured
#: on the H200, bench/gpu_gemv_bench.py, 2026-12-01: 10-20% on Qwen2.5 MLP shapes, 52% on
#: the LM head); bench/gpu_nbits_prefill_bench.py times both paths at every row count.
GEMV_BANDWIDTH_SHARE = 0.25


def gemv_rows(k: int, n: int, bits: int, block: int, act_itemsize: int, scale_itemsize: int):
    """Most rows of A that run as GEMV launches of up to ``GEMV_MAX_M`` rows (each reading
    the packed weight once, at ``GEMV_BANDWIDTH_SHARE`` of the bandwidth) before one
    dequantisation (reading the packed weight, writing the ``act_itemsize`` one) and a
    cuBLAS GEMM reading it back cost less: both are bound by memory at these row counts,
    so the device's bandwidth cancels and the shape alone decides."""
    packed = n * (-(-k // block)) * (block * bits // 8 + scale_itemsize)
    dense = n * k * act_itemsize
    launches = max(1, int(GEMV_BANDWIDTH_SHARE * (packed + 2 * dense) / packed))
    return launches * K_.GEMV_MAX_M


def gemm_tile(n: int, k: int, itemsize: int) -> int:
    """Rows of the weight dequantised per GEMM tile: at most ``GEMM_TILE_BYTES`` of them, and
    where that splits N, a multiple of 128 rows, so every tile's block of output columns
    starts 256 bytes in and cuBLAS keeps its aligned kernels (an LM head cut at 21845 rows
    ran an align-1 kernel: 9 of a 2000-token prefill's 32.5 ms, against 1.3 dense)."""
    tile = max(1, min(n, GEMM_TILE_BYTES // (k * itemsize)))
    if tile < n and tile >= GEMM_TILE_ALIGN:
        tile -= tile % GEMM_TILE_ALIGN
    return tile


def _check_attrs(node: NodeInfo) -> tuple[int, int, int, int]:
    k = int(node.attr("K"))
    n = int(node.attr("N"))
    bits = int(node.attr("bits", 4))
    block = int(node.attr("block_size"))
    if bits not in (2, 4, 8):
        raise fail(f"bits={bits} is not supported; use 2, 4 or 8")
    if block < 16 or block & (block - 1):
        raise fail(f"block_size={block} must be a power of two >= 16")
    if k < 1 or n < 1:
        raise fail(f"K={k} and N={n} must be positive")
    if int(node.attr("weight_prepacked", 0)) != 0:
        raise fail("weight_prepacked != 0 (onnxruntime's CUDA-specific layout) is not supported")
    return k, n, bits, block


@kernel("MatMulNBits", domain="com.microsoft", dtypes=("float", "float16"), capture_safe=True)
def matmul_nbits(node: NodeInfo, xp: Any):
    k, n, bits, block = _check_attrs(node)
    wts = Weights(node, k, n, bits, block, xp)
    a_dtype = node.input_dtype(0)
    if a_dtype is None:  # the spec gives A and scales one type
        a_dtype = np.asarray(node.const_input(2)).dtype
    a_dtype = np.dtype(a_dtype)
    out_c = ctype_of(a_dtype, "MatMulNBits: A")
    bias_const = node.const_input(5) if node.has_input(5) else None
    has_bias = node.has_input(5)
    if wts.empty:
        return _omitted_projection(n, xp)
    int8_a = int(node.attr("accuracy_level", 0)) == 4 and bits in (4, 8)
    return NBitsRunner(wts, a_dtype, out_c, int8_a, has_bias, bias_const, xp)


def _omitted_projection(n: int, xp: Any):
    """An empty B: the output is the (broadcast) bias, or zeros, as on the CPU."""

    def run(a, b=None, scales=None, zero_points=None, g_idx=None, bias=None):
        y = xp.zeros(a.shape[:-1] + (n,), dtype=a.dtype)
        if bias is not None:
            y += bias.astype(a.dtype, copy=False)
        return (y,)

    return run


class NBitsRunner:
    """The built node: device copies of the weights, compiled kernels, launch plans."""

    def __init__(self, w: Weights, a_dtype, out_c, int8_a, has_bias, bias_const, xp) -> None:
        self.xp, self.w, self.n, self.k = xp, w, w.n, w.k
        self.a_dtype = a_dtype
        self.int8_a = int8_a
        self.has_bias = has_bias
        # The activations the weight kernels see: float32 after int8 rounding, else A's type.
        act_dtype = np.dtype(np.float32) if int8_a else a_dtype
        self.act_dtype = act_dtype
        ta = ctype_of(act_dtype, "MatMulNBits: A")
        ts = ctype_of(w.scales.host.dtype, "MatMulNBits: scales")
        zk = w.zp_kind
        sms = sm_count()
        self.geoms = {mt: K_.gemv_geometry(w.n, w.chunks, w.bits, mt, sms) for mt in (1, 2, 4, 8)}
        names = {
            mt: K_.gemv_name(ta, ts, out_c, w.bits, w.block, zk, g.r, mt)
            for mt, g in self.geoms.items()
        }
        dq_name = K_.dequant_name(ts, ta, w.bits, w.block, zk)
        q_name = K_.quantize_name(ctype_of(a_dtype, "MatMulNBits: A"))
        mod = K_.module((*names.values(), dq_name, q_name))
        self.gemv = {mt: mod.get_function(nm) for mt, nm in names.items()}
        self.dummy_f32 = xp.zeros((1,), dtype=np.float32)
        # Split K's tickets, one per block of a split: zeroed once here, then put back to zero
        # by each launch's merging blocks, so a captured launch replays on them.
        dummy_i32 = xp.zeros((1,), dtype=np.int32)
        self.done = {
            mt: xp.zeros((g.bps,), dtype=np.int32) if g.splits > 1 else dummy_i32
            for mt, g in self.geoms.items()
        }
        self.dequant = mod.get_function(dq_name)
        self.quantize = mod.get_function(q_name)
        self.bias = None
        if bias_const is not None:
            self.bias = xp.asarray(np.asarray(bias_const).reshape(-1).astype(a_dtype))
        self.dummy = xp.zeros((1,), dtype=a_dtype)
        i32 = np.int32
        self.shape_args = (i32(w.n), i32(w.k), i32(w.kb), i32(w.rs), i32(w.zs), i32(w.chunks))
        self.sms = sms
        self.tile = gemm_tile(w.n, w.k, act_dtype.itemsize)
        sc = w.scales.host.dtype.itemsize
        self.gemv_rows = gemv_rows(w.k, w.n, w.bits, w.block, act_dtype.itemsize, sc)
        #: the rule, for reports: which path a call of M rows takes
        self.routes = {
            f"M <= {self.gemv_rows}": f"GEMV, one launch per {K_.GEMV_MAX_M} rows",
            f"M > {self.gemv_rows}": f"dequantise {self.tile}-row tiles of the weight into "
            f"scratch, one cuBLAS GEMM each",
        }
        _log.debug("MatMulNBits K=%d N=%d bits=%d: %s", w.k, w.n, w.bits, self.routes)
        self.mma = None
        if MMA_GEMV and MMA.NbitsMma.takes(w.bits, a_dtype, zk, int8_a, w.block, xp):
            self.mma = MMA.NbitsMma(xp, a_dtype, w.scales.host.dtype, zk, w.block, q8=int8_a)
        self.layout = (w.kb, w.rs, w.zs, w.chunks)

    def __call__(self, a, b=None, scales=None, zero_points=None, g_idx=None, bias=None):
        xp, n, k = self.xp, self.n, self.k
        if a.shape[-1:] != (k,):
            raise ValueError(f"MatMulNBits: A's last dim is {a.shape[-1:]}, expected K={k}")
        if a.dtype != self.a_dtype:
            raise ValueError(
                f"MatMulNBits: A is {a.dtype} but the node was built for {self.a_dtype}"
            )
        lead = a.shape[:-1]
        m = 1
        for d in lead:
            m *= d
        bias = self.bias_for(bias)
        tables = self.tables(b, scales, zero_points)
        if m == 0:
            return (xp.empty(lead + (n,), dtype=self.a_dtype),)
        a2 = xp.ascontiguousarray(a).reshape(m, k)
        if self.mma is not None and self.mma.fits(m, self.w.chunks, self.w.kb):
            # the tensor-core GEMV rounds A to int8 itself (accuracy_level 4)
            y = self.mma(a2, m, self.n, self.k, tables[:3], self.layout, bias)
            return (y.reshape(lead + (n,)),)
        if self.int8_a:
            a2 = self._round_int8(a2, m)
        if m <= K_.GEMV_MAX_M:
            y = self._gemv(a2, m, bias, tables)
        elif m <= self.gemv_rows:
            y = self._gemv_rows(a2, m, bias, tables)
        else:
            y = self._gemm(a2, m, bias, tables)
        return (y.reshape(lead + (n,)),)

    def tables(self, b, scales, zero_points):
        """B, scales, packed zero points and float zero points as the kernels read them (the
        session's device copies where their layout suits; placeholders for omitted ones)."""
        w = self.w
        tables = (w.b.get(b), w.scales.get(scales))
        if w.zp8 is not None:
            return tables + (w.zp8.get(zero_points), tables[1])
        if w.zpf is not None:
            return tables + (tables[0], w.zpf.get(zero_points))
        return tables + tables  # placeholders the kernels do not read

    def bias_for(self, bias):
        """The bias the kernels add (the node's constant one, or the given one checked)."""
        if not self.has_bias:
            return None
        if self.bias is not None:
            return self.bias
        if bias is None:
            return None
        if bias.size != self.n:
            raise ValueError(f"MatMulNBits: bias has {bias.size} values, expected N={self.n}")
        return self.xp.ascontiguousarray(bias.reshape(-1).astype(self.a_dtype, copy=False))

    def _round_int8(self, a2, m):
        w = self.w
        out = self.xp.empty((m, w.k), dtype=np.float32)
        warps = m * w.kb
        blocks = -(-warps * 32 // K_.BLOCK_THREADS)
        i32 = np.int32
        self.quantize(
            (blocks,), (K_.BLOCK_THREADS,), (a2, out, i32(m), i32(w.k), i32(w.block), i32(w.kb))
        )
        return out

    def _gemv_rows(self, a2, m, bias, tables):
        """More rows than one GEMV launch takes: a launch per ``GEMV_MAX_M`` rows."""
        y = self.xp.empty((m, self.n), dtype=self.a_dtype)
        step = K_.GEMV_MAX_M
        for r0 in range(0, m, step):
            rows = min(step, m - r0)
            self._gemv(a2[r0 : r0 + rows], rows, bias, tables, y[r0 : r0 + rows])
        return y

    def _gemv(self, a2, m, bias, tables, y=None):
        mt = K_.mt_for(m)
        g = self.geoms[mt]
        xp, i32 = self.xp, np.int32
        if y is None:
            y = xp.empty((m, self.n), dtype=self.a_dtype)
        bias_arg = self.dummy if bias is None else bias
        has_bias = i32(bias is not None)
        split = g.splits > 1
        part = xp.empty((g.splits, m, self.n), dtype=np.float32) if split else self.dummy_f32
        args = (
            a2,
            *tables,
            bias_arg,
            y,
            part,
            self.done[mt],
            i32(m),
            *self.shape_args,
            i32(g.log2g),
            i32(g.seg_chunks),
            has_bias,
            i32(g.bps),
            i32(g.cps),
        )
        self.gemv[mt]((g.blocks,), (K_.BLOCK_THREADS,), args, shared_mem=g.smem)
        return y

    def _gemm(self, a2, m, bias, tables):
        """Tiles of N: dequantise rows into scratch, then one cuBLAS product per tile written
        into its columns of the output (over the broadcast bias, beta = 1: rounded once)."""
        from onnxep.providers_cuda import blas

        xp, w = self.xp, self.w
        i32 = np.int32
        act = self.act_dtype
        # int8-rounded activations are float32, and so is their product: a tile at a time,
        # rounded to A's type into its columns
        direct = act == self.a_dtype
        out = xp.empty((m, self.n), dtype=self.a_dtype)
        if bias is not None and direct:
            out[...] = bias
        beta = 0.0 if bias is None else 1.0
        for n0 in range(0, self.n, self.tile):
            rows = min(self.tile, self.n - n0)
            wt = xp.empty((rows, w.k), dtype=act)
            words = rows * (-(-w.k // (32 // w.bits)))
            blocks = max(1, min(-(-words // K_.BLOCK_THREADS), self.sms * 16))
            args = (*tables, wt, i32(n0), i32(rows))
            vec = i32(w.k % (32 // w.bits) == 0 and all_aligned((wt,)))
            self.dequant(
                (blocks,),
                (K_.BLOCK_THREADS,),
                (*args, i32(w.k), i32(w.kb), i32(w.rs), i32(w.zs), vec),
            )
            if direct:
                blas.gemm(a2, wt, trans_b=True, beta=beta, out=out[:, n0 : n0 + rows])
            else:
                yt = xp.empty((m, rows), dtype=act)
                if bias is not None:
                    yt[...] = bias[n0 : n0 + rows]
                out[:, n0 : n0 + rows] = blas.gemm(a2, wt, trans_b=True, beta=beta, out=yt)
                del yt
            del wt  # back to the pool before the next tile's scratch
        return out
