"""MatMulNBits GEMV with 4-bit weights and float16 activations on the tensor cores.

``nbits_cuda``'s GEMV turns each weight into a float32 and spends three
instructions a value (a byte permute, a subtraction, an FMA): on an LM head it
keeps the H200's issue slots busier than its memory (52% of copy bandwidth).
This kernel reads the same packed rows once with 16-byte loads, turns a 32-bit
word of eight 4-bit values into four f16x2 pairs of ``q - zero_point`` with
one shift, four masks and four f16x2 operations (exact: small integers), and
lets ``mma.sync.m16n8k16`` (float16 in, float32 sums, products exact) do the
multiply-adds: about 1.4 instructions a value.

Layout of one MMA (a warp; lane = 4 g + t):

* B (16 k x 8 columns) is the weights: lane (g, t) holds column ``n0 + g``.
  Each lane loads the 16-byte chunk ``4 ks + t`` of its column's row (32
  values, one quantization block when block_size >= 32), so the four lanes of
  a column read 64 contiguous bytes and a k-step covers 128 values of K. A
  word's four pairs are (q0, q4), (q1, q5), (q2, q6), (q3, q7); two of them
  are a B fragment, so a chunk feeds eight MMAs.
* A (16 rows x 16 k) is the activations, spread so that each product stays in
  its quantization block: A row ``4 m + t`` holds row m of the activations at
  the k positions lane t supplies and zeros elsewhere. D row ``4 m + t`` is
  then row m's dot product with chunk t alone, scaled by that chunk's scale in
  float32 (``fmaf``, as the CPU scales once per block) into the lane's sums;
  rows 8..15 carry rows m + 2, a second MMA rows 4..7 (up to 8 rows of A).
* A is staged once per thread block in shared memory, already in fragment
  order (the four pairs of each 8-value word), zero past K and past M; with
  ``NORM`` it is staged normalised (``SimplifiedLayerNormalization`` or
  ``SkipSimplifiedLayerNormalization`` folded into the GEMV: the same steps and
  reduction order as ``norm_rows``, so the same bits), the residual sum
  written by block 0.

A tile is 8 output columns; ``P`` warps share a tile and split its k-steps
(warp p takes k-steps p, p + P, ...) when the weight's tiles alone are too few
to keep the device busy (narrow N, long K), adding their sums through shared
memory in warp order (the same bits on every run). The split reads only the
weight's rows and K, so the SwiGLU and normalising instantiations sum every
column exactly as the plain GEMV does on the same weight. Blocks walk units of
``8 / P`` tiles with a grid-stride loop, so a block stages A once for several
units. With ``SWIGLU`` a warp reads the gate rows ``n`` and the up rows
``N + n`` of a joined gate/up weight and writes the SwiGLU of the two, rounded
where the unfused MatMulNBits and SwiGLU nodes round. The bias is added to the
float32 sum and the result rounded once, as ``nbits_cuda``'s GEMV does.

With ``accuracy_level=4`` (``Q8``) the staging rounds A to int8 per block of K as
``nbits_cuda``'s ``quantize_a_int8`` does (float16 or float32 A, amax per block,
``rint(a * 127 / amax)``) and stages the integers themselves, which float16 holds
exactly; the products and their block sums are then exact integers, and each D value is
scaled by the weight's and the activations' block scales in float32. One launch
replaces the rounding launch and the GEMV.

Takes: bits = 4, float16 A, or float32 A with ``accuracy_level=4``; no or packed uint8
zero points; a power-of-two block_size >= 16; at most 8 rows whose staged A fits
:data:`SMEM_BUDGET`; a device of compute capability 8.0 or newer. ``nbits_cuda`` runs
the rest (float32 A at accuracy level 0, 2- and 8-bit weights, float zero points).

:data:`MMA_PRIMS` is the only block that names the f16x2 and MMA instructions;
the tests' kernel emulator swaps it for host versions of the same names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import elementwise as EW
from . import reduce_cuda as K
from .norm_cuda import NORM_HELPERS, NORM_PROLOGUE
from .reduce_source import COMMON

#: Threads per block: 8 warps.
BLOCK = 256
WARPS = BLOCK // 32
#: Rows of A the kernel takes.
MAX_M = 8
#: Row tiles (instantiations): the launch for ``m`` rows runs the smallest covering it.
ROW_TILES = (1, 2, 4, 8)
#: Values of K per k-step: one 16-byte chunk of 32 4-bit values for each lane of a column.
KSTEP = 128
#: Dynamic shared memory for the staged A (bytes): ``mt * ksteps * 256`` plus 64 bytes of
#: zeros. A block may hold 48 KiB without opting in, static arrays (4.2 KiB here) included.
SMEM_BUDGET = 44 * 1024
#: Warps per SM a launch should reach before K is split between the warps of a tile.
FILL_WARPS_PER_SM = 16
#: Blocks per SM of the grid-stride loop (more queue; each stages A once).
BLOCKS_PER_SM = 8
#: Zero-point kinds the kernel takes (``nbits_cuda``'s numbering).
ZP_NONE, ZP_PACKED = 0, 1

#: The f16x2 and MMA instructions (sm_80+; a device below that never launches the kernel,
#: and the MMA compiles to a trap there so the module still builds), and A's shared memory.
MMA_PRIMS = r"""
__device__ __forceinline__ unsigned h2_sub(unsigned a, unsigned b) {
  unsigned d;
  asm("sub.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ unsigned h2_fma(unsigned a, unsigned b, unsigned c) {
  unsigned d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
// d += A B for one m16n8k16 tile: a holds the lane's four f16x2 of A, b0 and b1 its two of B.
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                          unsigned b1) {
#if __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}
__device__ __forceinline__ uint4 ldg16(const void* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}
__device__ __forceinline__ unsigned perm(unsigned a, unsigned b, unsigned s) {
  return __byte_perm(a, b, s);
}
__device__ __forceinline__ unsigned hbits(__half h) { return __half_as_ushort(h); }
extern __shared__ uint4 nm_smem[];
"""

MMA_BODY = (
    COMMON
    + NORM_HELPERS
    + NORM_PROLOGUE
    + r"""
namespace nm {

__device__ __forceinline__ float sigmoid(float x) { return SIGMOID_EXPR; }
template <typename T> __device__ __forceinline__ float rnd(float x) {
  return to_f(from_f<T>(x));
}
__device__ __forceinline__ uint4 zero4() { return make_uint4(0u, 0u, 0u, 0u); }

// Eight halves h0..h7 (one 16-byte word of A) as the pairs an A fragment takes: (h0, h4),
// (h1, h5), (h2, h6), (h3, h7), the order a weight word's nibbles come out in.
__device__ __forceinline__ uint4 pair_up(unsigned x, unsigned y, unsigned z, unsigned w) {
  return make_uint4(perm(x, z, 0x5410u), perm(x, z, 0x7632u), perm(y, w, 0x5410u),
                    perm(y, w, 0x7632u));
}

__device__ __forceinline__ uint4 pack_halves(const unsigned (&h)[8]) {
  return pair_up(h[0] | (h[1] << 16), h[2] | (h[3] << 16), h[4] | (h[5] << 16),
                 h[6] | (h[7] << 16));
}

// Words [0, 4 * cpad) of row m of the staged A: word i holds values 8i .. 8i + 7, paired.
__device__ __forceinline__ uint4* a_row(int m, int cpad) { return nm_smem + (i64)m * cpad * 4; }

// A's rows as they are (zeros past K and for rows M .. MT - 1).
__device__ __forceinline__ void stage_plain(const __half* __restrict__ a, int M, int MT, int K,
                                            int cpad, int vec) {
  const int words = cpad * 4;
  for (int i = threadIdx.x; i < MT * words; i += blockDim.x) {
    const int m = i / words, item = i - m * words, k0 = item * 8;
    uint4 v = zero4();
    if (m < M && k0 < K) {
      const __half* row = a + (i64)m * K;
      if (vec) {  // K is a whole number of words and A is 16-byte aligned
        const uint4 u = load16(row + k0);
        v = pair_up(u.x, u.y, u.z, u.w);
      } else {
        unsigned h[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) h[j] = k0 + j < K ? hbits(row[k0 + j]) : 0u;
        v = pack_halves(h);
      }
    }
    a_row(m, cpad)[item] = v;
  }
}

// A[m][k] (m < M, k < K) as the unfused nodes stored it, in float32: a itself, or with NORM
// the norm's output rounded to TA (its row's inv in rinv) and s the residual sum.
template <typename TA, int NORM>
__device__ __forceinline__ float a_value(const TA* __restrict__ a, const TA* __restrict__ skip,
                                         const TA* __restrict__ nbias,
                                         const TA* __restrict__ gamma, int m, int k, int K,
                                         int skip_rows, const float* rinv, float* s) {
  if (!NORM) return to_f(a[(i64)m * K + k]);
  const TA* sr = skip == nullptr ? nullptr : skip + (i64)(m % skip_rows) * K;
  *s = residual(a + (i64)m * K, sr, nbias, (i64)k);
  return to_f(from_f<TA>(prologue_value(*s, rinv[m], gamma, (i64)k)));
}

// A staged for every case but stage_plain's: with NORM normalised as norm_rows normalises it
// (NORM_PROLOGUE: the rows' inv first, then each value; block 0 writes the rounded residual
// sums to sum_out), with Q8 rounded to int8 per block of K as quantize_a_int8 rounds it
// (amax of the block, q = rint(v * 127 / amax)): q itself is staged, a small integer float16
// holds exactly, and amax per row and block is kept for the scales. Zeros past K and M.
template <typename TA, int NORM, int Q8>
__device__ __forceinline__ void stage_general(
    const TA* __restrict__ a, const TA* __restrict__ skip, const TA* __restrict__ nbias,
    const TA* __restrict__ gamma, TA* __restrict__ sum_out, int M, int MT, int K, int cpad,
    int KB, int log2blk, int skip_rows, float eps, int tpr, int vec, float* shv, float* rinv,
    float* amax) {
  const int words = cpad * 4, nt = blockDim.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = nt >> 5;
  if (NORM) {
    for (int m = 0; m < M; ++m) {
      const TA* sr = skip == nullptr ? nullptr : skip + (i64)(m % skip_rows) * K;
      const float inv = prologue_inv(a + (i64)m * K, sr, nbias, (i64)K, eps, tpr, vec, shv);
      if (threadIdx.x == 0) rinv[m] = inv;
    }
    __syncthreads();
  }
  if (Q8) {  // a warp per (row, block): the block's amax, fmaxf ignoring NaN as the CPU's
    const int blk = 1 << log2blk;
    for (int w = warp; w < MT * KB; w += nw) {
      const int m = w / KB, kb = w - m * KB;
      float mx = 0.f, s;
      if (m < M) {
        for (int i = lane; i < blk; i += 32) {
          const int k = kb * blk + i;
          if (k < K) {
            mx = fmaxf(mx, fabsf(a_value<TA, NORM>(a, skip, nbias, gamma, m, k, K, skip_rows,
                                                   rinv, &s)));
          }
        }
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, shfl_xor(mx, off));
      if (lane == 0) amax[w] = mx;
    }
    __syncthreads();
  }
  TA* so = (NORM && sum_out != nullptr && blockIdx.x == 0) ? sum_out : nullptr;
  for (int i = threadIdx.x; i < MT * words; i += nt) {
    const int m = i / words, item = i - m * words, k0 = item * 8;
    unsigned h[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int k = k0 + j;
      h[j] = 0u;
      if (m < M && k < K) {
        float s = 0.f;
        float v = a_value<TA, NORM>(a, skip, nbias, gamma, m, k, K, skip_rows, rinv, &s);
        if (Q8) {
          const float mx = amax[m * KB + (k >> log2blk)];
          v = rintf(v * (127.0f / (mx == 0.f ? 1.f : mx)));
        }
        h[j] = hbits(from_f<__half>(v));
        if (so != nullptr) so[(i64)m * K + k] = from_f<TA>(s);
      }
    }
    a_row(m, cpad)[item] = pack_halves(h);
  }
}

// One 32-bit word of 4-bit weights as f16x2 pairs of q - z, exactly: (q0, q4), (q1, q5),
// (q2, q6), (q3, q7). A nibble masked into the mantissa of 1024 (0x6400) is 1024 + q, or
// 1024 + 16 q for the upper nibble of a byte, which 1/16 then brings down to 64 + q.
__device__ __forceinline__ void dequant4(unsigned w, unsigned z, unsigned (&h)[4]) {
  const unsigned sub = (0x6400u + z) * 0x10001u;          // 1024 + z
  const unsigned neg = (0xD400u + 16u * z) * 0x10001u;    // -(64 + z)
  const unsigned top = w >> 8;
  h[0] = h2_sub((w & 0x000F000Fu) | 0x64006400u, sub);
  h[1] = h2_fma((w & 0x00F000F0u) | 0x64006400u, 0x2C002C00u, neg);
  h[2] = h2_sub((top & 0x000F000Fu) | 0x64006400u, sub);
  h[3] = h2_fma((top & 0x00F000F0u) | 0x64006400u, 0x2C002C00u, neg);
}

// Lines first, first + step, ... of the bytes [p, p + n) asked for in L2 (whole 128-byte
// lines, the first one aligned down: an allocation never starts inside a line).
__device__ __forceinline__ void prefetch_range(const void* p, i64 n, int first, int step) {
  const char* lo = reinterpret_cast<const char*>(p);
  const char* hi = lo + n;
  for (const char* q = lo - (reinterpret_cast<unsigned long long>(lo) & 127) + (i64)first * 128;
       q < hi; q += (i64)step * 128)
    prefetch_l2(q);
}

__device__ __forceinline__ unsigned word_of(const uint4& v, int j) {
  return j == 0 ? v.x : (j == 1 ? v.y : (j == 2 ? v.z : v.w));
}

}  // namespace nm

// y[m, n] = sum_k A[m, k] (q[n, k] - zp[n, k / B]) scale[n, k / B] (+ bias[n]), A staged as
// the module describes (normalised with NORM, rounded to int8 per block with Q8). With
// SWIGLU the weight holds 2N rows (gate, then up) and y[m, n] = SwiGLU of the gate and up
// sums. B is (rows, RS) bytes, RS = 16 C; S k-steps of 4 chunks; units of 8 >> log2p tiles of
// 8 columns; P = 1 << log2p warps a tile. TA is A's (and y's) type.
template <typename TA, typename TS, int ZP, int SUB16, int MT, int SWIGLU, int NORM, int Q8>
__global__ void __launch_bounds__(256) nbits_mma(
    const TA* __restrict__ a, const TA* __restrict__ skip, const TA* __restrict__ nbias,
    const TA* __restrict__ gamma, TA* __restrict__ sum_out, const unsigned char* __restrict__ b,
    const TS* __restrict__ scales, const unsigned char* __restrict__ zp8,
    const TA* __restrict__ bias, TA* __restrict__ y, i64 M_, i64 N_, i64 K_, i64 KB_, i64 RS_,
    i64 ZS_, i64 C_, i64 S_, i64 log2blk_, i64 log2p_, i64 units_, i64 has_bias_, i64 vec_,
    i64 skip_rows_, i64 tpr_, double eps_) {
  using namespace nm;
  constexpr int R = SWIGLU ? 2 : 1;      // weight rows a lane reads per column (gate, up)
  constexpr int U = SWIGLU ? 2 : 4;      // k-steps whose loads are in flight together
  constexpr int MQ = MT > 4 ? 2 : 1;     // MMAs per B fragment (4 rows of A each)
  constexpr int HI = MT > 2;             // A rows m + 2 in the fragments' upper half
  constexpr int SUBS = SUB16 ? 2 : 1;    // quantization blocks per chunk
  constexpr int WPS = 4 / SUBS;          // words of a chunk per block
  const int M = (int)M_, N = (int)N_, K = (int)K_, KB = (int)KB_, C = (int)C_, S = (int)S_;
  const int ZS = (int)ZS_, log2blk = (int)log2blk_, log2p = (int)log2p_;
  const i64 RS = RS_;
  const int units = (int)units_, has_bias = (int)has_bias_;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int P = 1 << log2p, tl = warp >> log2p, p = warp & (P - 1), TB = 8 >> log2p;
  const int T = (N + 7) >> 3;
  const int cpad = 4 * S;
  __shared__ float shv[32];
  __shared__ float rinv[8];
  __shared__ float red[8 * R * 64];  // [warp][r][m][column] partial sums when P > 1
  uint4* zeros = nm_smem + (i64)MT * cpad * 4;
  float* amax = reinterpret_cast<float*>(zeros + 4);  // [MT][KB] with Q8

  // The packed weights and their scales are this product's bulk and no earlier kernel writes
  // them: the lines of the block's first unit are asked for in L2 before the wait, so under
  // programmatic dependent launch they stream in while the kernel writing A still runs.
  pdl_trigger();
  if ((int)blockIdx.x < units && (int)blockIdx.x * TB + tl < T) {
    const int n0 = ((int)blockIdx.x * TB + tl) * 8;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      nm::prefetch_range(b + ((i64)min(n0 + g, N - 1) + (i64)r * N) * RS, RS, t + 4 * p, 4 * P);
      if (p == 0) {  // the tile's rows of scales are contiguous
        const i64 s0 = (i64)n0 + (i64)r * N, s1 = (i64)min(n0 + 8, N) + (i64)r * N;
        nm::prefetch_range(scales + s0 * KB, (s1 - s0) * KB * (i64)sizeof(TS), lane, 32);
      }
    }
  }
  pdl_wait();
  if (NORM || Q8) {
    stage_general<TA, NORM, Q8>(a, skip, nbias, gamma, sum_out, M, MT, K, cpad, KB, log2blk,
                                (int)skip_rows_, (float)eps_, (int)tpr_, (int)vec_, shv, rinv,
                                amax);
  } else {
    stage_plain(reinterpret_cast<const __half*>(a), M, MT, K, cpad, (int)vec_);
  }
  if (threadIdx.x < 4) zeros[threadIdx.x] = zero4();
  __syncthreads();
  // A lanes hold A row 4 m0 + t (its k positions are lane t's): their row's t is their own,
  // and (one row of A) only the lanes of row 0.
  const int m0 = g >> 2;
  const bool alane = (g & 3) == t && (MT > 1 || m0 == 0);

  // Uniform over the block: every thread runs the same trips (the barriers below).
  for (int unit = blockIdx.x; unit < units; unit += gridDim.x) {
    const int tile = unit * TB + tl;
    const int n0 = tile * 8;
    float acc[MQ][R][4];
#pragma unroll
    for (int q = 0; q < MQ; ++q)
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[q][r][i] = 0.f;
    if (tile < T) {  // warp-uniform: the MMAs and shuffles see whole warps
      i64 wrow[R], srow[R][2];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        // Columns past N read the last column (valid memory); their sums are not stored.
        wrow[r] = (i64)min(n0 + g, N - 1) + (i64)r * N;
#pragma unroll
        for (int j = 0; j < 2; ++j) srow[r][j] = (i64)min(n0 + 2 * t + j, N - 1) + (i64)r * N;
      }
      // Warp p of the tile sums k-steps p, p + P, p + 2P, ... in that order, U of them loaded
      // at a time: which warp adds which k-step, and in what order, is U's choice alone.
      for (int j0 = 0; p + j0 * P < S; j0 += U) {
        uint4 wv[U][R];
        unsigned zq[U][R];
        float sc[U][R][SUBS][2];
        float asc[U][SUBS][MQ][2];  // with Q8: the activations' scale of each D row's block
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int ks = p + (j0 + u) * P;
          if (ks < S) {
            const int c = 4 * ks + t;  // this lane's chunk of its column
#pragma unroll
            for (int r = 0; r < R; ++r) {
              wv[u][r] = c < C ? ldg16(b + wrow[r] * RS + (i64)c * 16) : zero4();
              zq[u][r] = 8u;  // no zero points: 2^(bits - 1)
              if (ZP == 1) {
                const int kb = SUB16 ? 2 * c : (c * 32) >> log2blk;
                const unsigned byte = kb < KB ? zp8[wrow[r] * ZS + (kb >> 1)] : 0u;
                zq[u][r] = SUB16 ? byte : (byte >> ((kb & 1) * 4)) & 15u;
              }
            }
            const int cs = 4 * ks + (g & 3);  // the chunk of this lane's D rows
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
              for (int sb = 0; sb < SUBS; ++sb) {
                const int kb = SUB16 ? 2 * cs + sb : (cs * 32) >> log2blk;
#pragma unroll
                for (int j = 0; j < 2; ++j)
                  sc[u][r][sb][j] = kb < KB ? to_f(scales[srow[r][j] * KB + kb]) : 0.f;
              }
            if (Q8) {
#pragma unroll
              for (int sb = 0; sb < SUBS; ++sb) {
                const int kb = SUB16 ? 2 * cs + sb : (cs * 32) >> log2blk;
#pragma unroll
                for (int q = 0; q < MQ; ++q)
#pragma unroll
                  for (int hh = 0; hh < 2; ++hh) {
                    const int m = 4 * q + m0 + 2 * hh;
                    asc[u][sb][q][hh] = m < MT && kb < KB ? amax[m * KB + kb] / 127.0f : 0.f;
                  }
              }
            }
          }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int ks = p + (j0 + u) * P;
          if (ks < S) {
            const uint4* ap = alane ? a_row(m0, cpad) + (4 * ks + t) * 4 : zeros;
            const i64 step2 = alane ? (i64)2 * cpad * 4 : 0;  // rows m0 + 2, + 4, + 6
#pragma unroll
            for (int sb = 0; sb < SUBS; ++sb) {
              float d[MQ][R][4];
#pragma unroll
              for (int q = 0; q < MQ; ++q)
#pragma unroll
                for (int r = 0; r < R; ++r)
#pragma unroll
                  for (int i = 0; i < 4; ++i) d[q][r][i] = 0.f;
#pragma unroll
              for (int jw = 0; jw < WPS; ++jw) {
                const int j = sb * WPS + jw;
                uint4 lo[MQ], hi[MQ];
#pragma unroll
                for (int q = 0; q < MQ; ++q) {
                  lo[q] = ap[2 * q * step2 + j];
                  hi[q] = HI ? ap[(2 * q + 1) * step2 + j] : zero4();
                }
                unsigned h[R][4];
#pragma unroll
                for (int r = 0; r < R; ++r) {
                  const unsigned z = SUB16 ? (sb ? zq[u][r] >> 4 : zq[u][r] & 15u) : zq[u][r];
                  dequant4(word_of(wv[u][r], j), z, h[r]);
                }
#pragma unroll
                for (int e = 0; e < 2; ++e) {
#pragma unroll
                  for (int q = 0; q < MQ; ++q) {
                    const unsigned af[4] = {e ? lo[q].z : lo[q].x, e ? hi[q].z : hi[q].x,
                                            e ? lo[q].w : lo[q].y, e ? hi[q].w : hi[q].y};
#pragma unroll
                    for (int r = 0; r < R; ++r)
                      mma_16816(d[q][r], af, h[r][2 * e], h[r][2 * e + 1]);
                  }
                }
              }
#pragma unroll
              for (int q = 0; q < MQ; ++q)
#pragma unroll
                for (int r = 0; r < R; ++r)
#pragma unroll
                  for (int i = 0; i < 4; ++i) {
                    float f = sc[u][r][sb][i & 1];
                    if (Q8) f *= asc[u][sb][q][i >> 1];
                    acc[q][r][i] = fmaf(f, d[q][r][i], acc[q][r][i]);
                  }
            }
          }
        }
      }
      // The four chunk lanes of a column quad (lane bits 2 and 3) add up; lanes 0-3 then hold
      // rows 4q, 4q + 2 and lanes 16-19 rows 4q + 1, 4q + 3, columns 2t and 2t + 1.
#pragma unroll
      for (int q = 0; q < MQ; ++q)
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            acc[q][r][i] += shfl_xor(acc[q][r][i], 4);
            acc[q][r][i] += shfl_xor(acc[q][r][i], 8);
          }
    }
    const bool owner = tile < T && (g & 3) == 0;
    if (P == 1) {
      if (owner) {
#pragma unroll
        for (int q = 0; q < MQ; ++q)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int m = 4 * q + m0 + (i >> 1) * 2, n = n0 + 2 * t + (i & 1);
            if (m < M && n < N) {
              float v = acc[q][0][i];
              if (has_bias) v += to_f(bias[n]);
              if (SWIGLU) {
                float u = acc[q][R - 1][i];
                if (has_bias) u += to_f(bias[N + n]);
                const float gv = rnd<TA>(v);
                const float act = rnd<TA>(gv * rnd<TA>(sigmoid(gv)));
                v = act * rnd<TA>(u);
              }
              y[(i64)m * N + n] = from_f<TA>(v);
            }
          }
      }
      continue;
    }
    if (owner) {
#pragma unroll
      for (int q = 0; q < MQ; ++q)
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int m = 4 * q + m0 + (i >> 1) * 2;
            if (m < MT) red[(warp * R + r) * 64 + m * 8 + 2 * t + (i & 1)] = acc[q][r][i];
          }
    }
    __syncthreads();
    // The warps of a tile add up in warp order; one thread per output.
    for (int o = threadIdx.x; o < TB * MT * 8; o += blockDim.x) {
      const int tl2 = o / (MT * 8), rem = o - tl2 * MT * 8, m = rem >> 3, cc = rem & 7;
      const int n = (unit * TB + tl2) * 8 + cc;
      if (m < M && n < N) {
        float v = 0.f, u = 0.f;
        for (int w = 0; w < P; ++w) {
          v += red[((tl2 * P + w) * R) * 64 + m * 8 + cc];
          if (SWIGLU) u += red[((tl2 * P + w) * R + R - 1) * 64 + m * 8 + cc];
        }
        if (has_bias) v += to_f(bias[n]);
        if (SWIGLU) {
          if (has_bias) u += to_f(bias[N + n]);
          const float gv = rnd<TA>(v);
          const float act = rnd<TA>(gv * rnd<TA>(sigmoid(gv)));
          v = act * rnd<TA>(u);
        }
        y[(i64)m * N + n] = from_f<TA>(v);
      }
    }
    __syncthreads();  // red is read before the next unit writes it
  }
}
""".replace("SIGMOID_EXPR", EW.UNARY["sigmoid"])
)


def source() -> str:
    """The kernels' source past ``reduce_source.PRIMITIVES`` (read at build time, so the
    emulator can stand its own :data:`MMA_PRIMS` in)."""
    return MMA_PRIMS + MMA_BODY


CT = {np.dtype(np.float16): "__half", np.dtype(np.float32): "float"}


def kernel_name(
    ta: str, ts: str, zp: int, sub16: bool, mt: int, swiglu: bool, norm: bool, q8: bool
) -> str:
    flags = f"{int(sub16)}, {mt}, {int(swiglu)}, {int(norm)}, {int(q8)}"
    return f"nbits_mma<{ta}, {ts}, {zp}, {flags}>"


def row_tile(m: int) -> int:
    for mt in ROW_TILES:
        if m <= mt:
            return mt
    raise ValueError(f"the int4 MMA GEMV takes at most {MAX_M} rows, got {m}")


@dataclass(frozen=True)
class MmaPlan:
    """How one launch covers an ``m`` x ``n`` product over ``chunks`` 16-byte chunks of K."""

    mt: int  # rows of A per launch (template)
    ksteps: int  # k-steps of four chunks
    log2p: int  # warps per tile, as a power of two
    units: int  # units of 8 >> log2p tiles the blocks walk
    grid: int
    smem: int  # dynamic shared memory, bytes


def smem_bytes(mt: int, chunks: int, kb: int = 0) -> int:
    """The staged A of ``mt`` rows (zero-padded to whole k-steps), its zero words and (int8
    activations: ``kb`` blocks a row) the blocks' amax."""
    return mt * (-(-chunks // 4)) * 4 * 64 + 64 + -(-mt * kb * 4 // 16) * 16


def fits(m: int, chunks: int, kb: int = 0) -> bool:
    """Whether ``m`` rows of ``chunks`` chunks (and ``kb`` amax a row) stage within
    :data:`SMEM_BUDGET`."""
    return 1 <= m <= MAX_M and smem_bytes(row_tile(m), chunks, kb) <= SMEM_BUDGET


def plan(m: int, n: int, chunks: int, sms: int, kb: int = 0, rows: int = 0) -> MmaPlan:
    """Geometry from the shape and the device's SM count (``n``: output columns; ``rows``:
    the weight's rows, 2n with the SwiGLU, ``n`` when 0).

    One warp per tile of 8 columns while the weight's tiles give every SM
    :data:`FILL_WARPS_PER_SM` warps; fewer than that (a down projection: narrow N,
    long K) share each tile among ``P`` warps (up to 8, never more than its
    k-steps), warp p summing k-steps p, p + P, ... The choice reads the weight's
    rows, so a SwiGLU GEMV sums each column as the plain GEMV on the same weight does.
    """
    mt = row_tile(m)
    ksteps = -(-chunks // 4)
    tiles = -(-n // 8)
    weight_tiles = -(-(rows or n) // 8)
    want = sms * FILL_WARPS_PER_SM
    p = 1
    while p < WARPS and 2 * p <= ksteps and weight_tiles * p < want:
        p *= 2
    units = -(-tiles // (WARPS // p))
    grid = max(1, min(units, sms * BLOCKS_PER_SM))
    return MmaPlan(mt, ksteps, p.bit_length() - 1, units, grid, smem_bytes(mt, chunks, kb))


_capable: dict[int, bool] = {}


def device_capable() -> bool:
    """Whether the current device runs ``mma.sync`` with float16 operands (sm_80 or newer)."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    ok = _capable.get(dev)
    if ok is None:
        ok = _capable[dev] = int(cupy.cuda.Device(dev).compute_capability) >= 80
    return ok


class NbitsMma:
    """The launches of one node: compiled instantiations for every row tile, plans by rows.

    ``q8``: the node's ``accuracy_level=4`` (A rounded to int8 per block of K in the
    staging); ``swiglu``: the SwiGLU epilogue; ``norm``: the RMS-norm prologue."""

    def __init__(
        self,
        xp: Any,
        a_dtype: Any,
        scales_dtype: Any,
        zp_kind: int,
        block: int,
        *,
        q8: bool = False,
        swiglu: bool = False,
        norm: bool = False,
    ) -> None:
        self.xp = xp
        self.a_dtype = np.dtype(a_dtype)
        self.q8, self.swiglu, self.norm = q8, swiglu, norm
        ta, ts = CT[self.a_dtype], CT[np.dtype(scales_dtype)]
        self.sub16 = block == 16
        self.log2blk = block.bit_length() - 1
        self.names = {
            mt: kernel_name(ta, ts, zp_kind, self.sub16, mt, swiglu, norm, q8) for mt in ROW_TILES
        }
        self.fns = K.compile_kernels(source(), tuple(self.names.values()))
        self.sms = K.sm_count()
        self._plans = K.PlanCache(self._plan)
        self._launches = K.PlanCache(self._launch_args)
        self._launch = self.emulated if xp is np else self.driver()

    @staticmethod
    def takes(bits: int, a_dtype: Any, zp_kind: int, int8_a: bool, block: int, xp: Any) -> bool:
        """Whether a node of these attributes is this kernel's case (the rows are checked per
        run by :func:`fits`): 4-bit weights, float16 A, or float32 A rounded to int8
        (``accuracy_level=4``), whose int8 values float16 holds exactly."""
        dt = np.dtype(a_dtype)
        if bits != 4 or not (dt == np.float16 or (dt == np.float32 and int8_a)):
            return False
        if zp_kind not in (ZP_NONE, ZP_PACKED) or block < 16 or block & (block - 1):
            return False
        return xp is np or device_capable()

    def fits(self, m: int, chunks: int, kb: int) -> bool:
        """Whether ``m`` rows of this node stage within the budget."""
        return fits(m, chunks, kb if self.q8 else 0)

    def _launch_args(
        self, m: int, n: int, k: int, layout: tuple, no_bias: bool, vec: bool
    ) -> tuple[str, int, int, tuple]:
        """A plain launch's kernel name, grid, shared memory and integer arguments."""
        kb, rs, zs, chunks = layout
        p = self._plans(m, n, chunks, kb)
        ints = (m, n, k, kb, rs, zs, chunks, p.ksteps, self.log2blk, p.log2p, p.units,
                int(not no_bias), int(vec), 1, 32, 0.0)  # fmt: skip
        return self.names[p.mt], p.grid, p.smem, ints

    def _plan(self, m: int, n: int, chunks: int, kb: int) -> MmaPlan:
        rows = 2 * n if self.swiglu else n
        return plan(m, n, chunks, self.sms, kb if self.q8 else 0, rows)

    def driver(self) -> Any:
        """Launches straight through the driver (``launch.Launcher``)."""
        from ..elementwise import stream_ptr_fn
        from ..launch import Launcher

        stream = stream_ptr_fn()
        # dependent: nbits_mma waits (pdl_wait) before it reads A or writes anything
        sig = "p" * 10 + "q" * 15 + "d"
        launchers = {name: Launcher(self.fns[name], sig, dependent=True) for name in self.fns}

        def launch(name: str, grid: int, smem: int, ptrs: tuple, ints: tuple) -> None:
            addrs = tuple(0 if x is None else x.data.ptr for x in ptrs)
            launchers[name](grid, BLOCK, addrs + ints, stream(), smem)

        return launch

    def emulated(self, name: str, grid: int, smem: int, ptrs: tuple, ints: tuple) -> None:
        """NumPy arrays (the tests' kernel emulator, whose shared memory stands in for the
        dynamic one): the kernel called as CuPy calls one."""
        if smem > SMEM_BUDGET:
            raise ValueError(f"{name}: {smem} bytes of shared memory")
        args = ptrs + tuple(np.int64(v) for v in ints[:-1]) + (np.float64(ints[-1]),)
        self.fns[name]((grid,), (BLOCK,), args)

    def __call__(
        self,
        a: Any,
        m: int,
        n: int,
        k: int,
        tables: tuple,
        layout: tuple[int, int, int, int],
        bias: Any = None,
        norm: tuple | None = None,
    ) -> Any:
        """``y`` (``m`` x ``n``, A's dtype) for ``a`` (``m`` x ``k`` contiguous; with ``norm``,
        the norm's input x); the caller checked :meth:`takes` and :meth:`fits`.

        ``tables``: B, scales and packed zero points (or anything for none) on the device;
        ``layout``: (KB, RS, ZS, chunks) as ``nbits_weights.Weights`` has them. ``norm``:
        (skip, skip_rows, nbias, gamma, sum_out, eps) for a normalising node.
        """
        y = self.xp.empty((m, n), self.a_dtype)
        b, scales, zp8 = tables[0], tables[1], tables[2]
        if norm is None:  # the decode path: its launch made once per shape
            vec = k % 8 == 0 and K.address(a) % 16 == 0  # stage_plain's float16 words
            name, grid, smem, ints = self._launches(m, n, k, layout, bias is None, vec)
            ptrs = (a, None, None, None, None, b, scales, zp8, bias, y)
            self._launch(name, grid, smem, ptrs, ints)
            return y
        kb, rs, zs, chunks = layout
        p = self._plans(m, n, chunks, kb)
        # norm_rows's own vector test, for its order of the sum of squares
        skip, skip_rows, nbias, gamma, sum_out, eps = norm
        tpr = K.row_threads(k)
        lanes = K.vector_width(self.a_dtype)
        vec = k % lanes == 0 and K.all_aligned((a, skip, nbias, gamma, sum_out))
        ptrs = (a, skip, nbias, gamma, sum_out, b, scales, zp8, bias, y)
        ints = (m, n, k, kb, rs, zs, chunks, p.ksteps, self.log2blk, p.log2p, p.units,
                int(bias is not None), int(vec), skip_rows, tpr, eps)  # fmt: skip
        self._launch(self.names[p.mt], p.grid, p.smem, ptrs, ints)
        return y
