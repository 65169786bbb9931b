"""com.microsoft MatMulNBits on CUDA: A @ dequantize(B).T (+ bias) with 2-, 4- or 8-bit weights.

Decode (up to 8 rows of A) runs one fused dequantise-GEMV launch; prefill
dequantises tiles of the weight into a scratch buffer and multiplies with
cuBLAS (``providers_cuda.blas``). The weight, scales and zero points must be
constant initializers: they are repacked once here, at session creation,
into the layout the kernels read (``_nbits_cuda`` describes it), so a run
costs one launch and reads each weight byte once. Numerics follow the CPU
kernel: float32 accumulation, zero points subtracted exactly, and with
``accuracy_level=4`` the activations rounded to int8 per block of K first,
with the CPU's arithmetic (the rounded activations match bit for bit).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from . import _nbits_cuda as K_
from ._quant_cuda import ctype_of, sm_count

#: Largest dequantised weight tile the prefill path holds at once (bytes).
GEMM_TILE_BYTES = 64 * 1024 * 1024


def _fail(why: str) -> NotSupported:
    return NotSupported(f"MatMulNBits: {why}")


def _const(node: NodeInfo, i: int, what: str) -> np.ndarray | None:
    """Input ``i`` as a NumPy array (None when omitted); decline when it is computed at run time."""
    if not node.has_input(i):
        return None
    v = node.const_input(i)
    if v is None:
        raise _fail(
            f"{what} (input {i}) must be a constant initializer on CUDA, where it is repacked "
            "once at session creation; this node computes it at run time"
        )
    return np.asarray(v)


class _Weights:
    """The node's constants, checked against K, N, bits and block_size and repacked (host side)."""

    def __init__(self, node: NodeInfo, k: int, n: int, bits: int, block: int) -> None:
        self.k, self.n, self.bits, self.block = k, n, bits, block
        self.kb = -(-k // block)
        blob = block * bits // 8
        b = _const(node, 1, "B")
        scales = _const(node, 2, "scales")
        zp = _const(node, 3, "zero_points")
        self._check_g_idx(_const(node, 4, "g_idx"))
        if b is None or scales is None:
            raise _fail("B and scales are required inputs")
        self.empty = b.size == 0
        if self.empty:
            return
        if b.dtype != np.uint8 or b.size != n * self.kb * blob:
            raise _fail(
                f"B must hold N * ceil(K / block_size) * block_size * bits / 8 = "
                f"{n * self.kb * blob} uint8 bytes (shape ({n}, {self.kb}, {blob})), got "
                f"{b.dtype} {tuple(b.shape)}"
            )
        vpc = 128 // bits
        self.chunks = -(-k // vpc)
        self.rs = 16 * self.chunks
        rows = b.reshape(n, self.kb * blob)
        # Rows cut or zero-padded to whole 16-byte chunks: the GEMV reads them with 16-byte
        # loads, and bytes past the chunk holding K's last value are never needed.
        keep = min(self.rs, rows.shape[1])
        packed = np.zeros((n, self.rs), np.uint8)
        packed[:, :keep] = rows[:, :keep]
        self.b = packed
        s = scales.reshape(n, -1)
        if s.shape[1] < self.kb:
            raise _fail(f"scales has {s.shape[1]} entries per row, need ceil(K/block)={self.kb}")
        s = s[:, : self.kb]
        if s.dtype not in (np.float16, np.float32):
            s = s.astype(np.float32)  # bfloat16 and float64 scales: float32, as the CPU does
        self.scales = np.ascontiguousarray(s)
        self.zp_kind, self.zp8, self.zpf, self.zs = K_.ZP_NONE, None, None, 1
        if zp is not None:
            z = zp.reshape(n, -1)
            if z.dtype == np.uint8:
                if z.shape[1] * (8 // bits) < self.kb:
                    raise _fail(
                        f"packed zero_points hold {z.shape[1] * (8 // bits)} values per row, "
                        f"need ceil(K/block)={self.kb}"
                    )
                self.zp_kind, self.zp8, self.zs = K_.ZP_PACKED, np.ascontiguousarray(z), z.shape[1]
            else:
                if z.shape[1] < self.kb:
                    raise _fail(f"zero_points has {z.shape[1]} per row, need {self.kb}")
                self.zp_kind = K_.ZP_FLOAT
                self.zpf = np.ascontiguousarray(z[:, : self.kb].astype(np.float32))

    def _check_g_idx(self, g_idx: np.ndarray | None) -> None:
        if g_idx is None:
            return
        natural = np.arange(self.k) // self.block
        gi = g_idx.reshape(-1)
        if gi.shape[0] < self.k or not np.array_equal(gi[: self.k], natural):
            raise _fail(
                "a g_idx that reorders quantization groups is not supported on CUDA (only "
                "g_idx[k] == k // block_size, the default order); the CPU provider runs it"
            )


def _check_attrs(node: NodeInfo) -> tuple[int, int, int, int]:
    k = int(node.attr("K"))
    n = int(node.attr("N"))
    bits = int(node.attr("bits", 4))
    block = int(node.attr("block_size"))
    if bits not in (2, 4, 8):
        raise _fail(f"bits={bits} is not supported; use 2, 4 or 8")
    if block < 16 or block & (block - 1):
        raise _fail(f"block_size={block} must be a power of two >= 16")
    if k < 1 or n < 1:
        raise _fail(f"K={k} and N={n} must be positive")
    if int(node.attr("weight_prepacked", 0)) != 0:
        raise _fail("weight_prepacked != 0 (onnxruntime's CUDA-specific layout) is not supported")
    return k, n, bits, block


@kernel("MatMulNBits", domain="com.microsoft", dtypes=("float", "float16"), capture_safe=True)
def matmul_nbits(node: NodeInfo, xp: Any):
    k, n, bits, block = _check_attrs(node)
    wts = _Weights(node, k, n, bits, block)
    a_dtype = node.input_dtype(0)
    if a_dtype is None:  # the spec gives A and scales one type
        a_dtype = np.asarray(node.const_input(2)).dtype
    a_dtype = np.dtype(a_dtype)
    out_c = ctype_of(a_dtype, "MatMulNBits: A")
    bias_const = node.const_input(5) if node.has_input(5) else None
    has_bias = node.has_input(5)
    if wts.empty:
        return _omitted_projection(n, bias_const, xp)
    int8_a = int(node.attr("accuracy_level", 0)) == 4 and bits in (4, 8)
    return _Runner(wts, a_dtype, out_c, int8_a, has_bias, bias_const, xp)


def _omitted_projection(n: int, bias_const: Any, xp: Any):
    """An empty B: the output is the (broadcast) bias, or zeros, as on the CPU."""

    def run(a, b=None, scales=None, zero_points=None, g_idx=None, bias=None):
        y = xp.zeros(a.shape[:-1] + (n,), dtype=a.dtype)
        if bias is not None:
            y += bias.astype(a.dtype, copy=False)
        return (y,)

    return run


class _Runner:
    """The built node: device copies of the weights, compiled kernels, launch plans."""

    def __init__(self, w: _Weights, a_dtype, out_c, int8_a, has_bias, bias_const, xp) -> None:
        import cupy

        self.xp, self.w, self.n, self.k = xp, w, w.n, w.k
        self.a_dtype = a_dtype
        self.int8_a = int8_a
        self.has_bias = has_bias
        # The activations the weight kernels see: float32 after int8 rounding, else A's type.
        act_dtype = np.dtype(np.float32) if int8_a else a_dtype
        self.act_dtype = act_dtype
        ta = ctype_of(act_dtype, "MatMulNBits: A")
        ts = ctype_of(w.scales.dtype, "MatMulNBits: scales")
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
        self.dequant = mod.get_function(dq_name)
        self.quantize = mod.get_function(q_name)
        # Uploaded once: these arrays are the node's weights from now on.
        self.b = cupy.asarray(w.b)
        self.scales = cupy.asarray(w.scales)
        self.zp8 = cupy.asarray(w.zp8) if w.zp8 is not None else self.b
        self.zpf = cupy.asarray(w.zpf) if w.zpf is not None else self.scales
        self.bias = None
        if bias_const is not None:
            self.bias = cupy.asarray(np.asarray(bias_const).reshape(-1).astype(a_dtype))
        self.dummy = cupy.zeros((1,), dtype=a_dtype)
        i32 = np.int32
        self.shape_args = (i32(w.n), i32(w.k), i32(w.kb), i32(w.rs), i32(w.zs), i32(w.chunks))
        self.sms = sms
        self.tile = max(1, min(w.n, GEMM_TILE_BYTES // (w.k * act_dtype.itemsize)))

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
        bias = self._bias(bias)
        if m == 0:
            return (xp.empty(lead + (n,), dtype=self.a_dtype),)
        a2 = xp.ascontiguousarray(a).reshape(m, k)
        if self.int8_a:
            a2 = self._round_int8(a2, m)
        if m <= K_.GEMV_MAX_M:
            y = self._gemv(a2, m, bias)
        else:
            y = self._gemm(a2, m, bias)
        return (y.reshape(lead + (n,)),)

    def _bias(self, bias):
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

    def _gemv(self, a2, m, bias):
        mt = K_.mt_for(m)
        g = self.geoms[mt]
        y = self.xp.empty((m, self.n), dtype=self.a_dtype)
        args = (
            a2,
            self.b,
            self.scales,
            self.zp8,
            self.zpf,
            self.dummy if bias is None else bias,
            y,
            np.int32(m),
            *self.shape_args,
            np.int32(g.log2g),
            np.int32(g.seg_chunks),
            np.int32(bias is not None),
        )
        self.gemv[mt]((g.blocks,), (K_.BLOCK_THREADS,), args, shared_mem=g.smem)
        return y

    def _gemm(self, a2, m, bias):
        """Tiles of N: dequantise rows into scratch, then one cuBLAS product per tile."""
        from onnxep.providers_cuda import blas

        xp, w = self.xp, self.w
        i32 = np.int32
        out = xp.empty((m, self.n), dtype=self.a_dtype)
        for n0 in range(0, self.n, self.tile):
            rows = min(self.tile, self.n - n0)
            wt = xp.empty((rows, w.k), dtype=self.act_dtype)
            words = rows * (-(-w.k // (32 // w.bits)))
            blocks = max(1, min(-(-words // K_.BLOCK_THREADS), self.sms * 16))
            args = (self.b, self.scales, self.zp8, self.zpf, wt, i32(n0), i32(rows))
            self.dequant(
                (blocks,),
                (K_.BLOCK_THREADS,),
                (*args, i32(w.k), i32(w.kb), i32(w.rs), i32(w.zs)),
            )
            yt = blas.gemm(a2, wt, trans_b=True)
            whole = rows == self.n
            if bias is not None:
                yt = yt.astype(np.float32) + bias[n0 : n0 + rows].astype(np.float32)
            if whole:
                return yt.astype(self.a_dtype, copy=False)
            out[:, n0 : n0 + rows] = yt
        return out
