"""GroupQueryAttention's single-token decode on tensor cores: split-K over the KV cache.

Why a kernel of its own: a decode step reads the whole KV cache once and does
``2 * G`` multiply-adds per element it reads (G query heads per KV head), so
it must stream K and V at the memory's bandwidth, which the CUDA-core kernel
(``gqa_decode`` in ``gqa_cuda.py``: 32 keys a block staged through shared
memory as float, the last block merging every split serially) does not come
near. Here (fp16, head sizes 64, 128 and 256, compute capability 8.0 and up):

* the grid is (splits, KV head x row group, batch), sized on the host for the
  cache's capacity (``kv_limit``), so one CUDA graph serves every length: each
  block reads ``seqlens_k`` on the device, takes its contiguous slice of the
  keys the row attends (:func:`split_chunk` spreads them over the splits) and
  returns at once when the slice is empty;
* a block's 4 warps take 16-key tiles of the slice in turn; a lane loads its
  share of a tile with 16-byte loads straight into registers (the next tile's
  while the current one computes), and the warp computes the scores of all the
  group's query heads (up to 16 rows of one ``mma.m16n8k16``) against the tile
  and then the tile's share of the output, both on tensor cores with float32
  accumulation, so every K and V element is read once for all G heads;
* online softmax per warp, then the warps merge in shared memory; a row whose
  keys one split holds is written at once, otherwise the split's partial
  (max, sum, unnormalised output) goes to a workspace that ``gqa_decode_merge``
  (one block per output row) combines.

Operand layouts (lane = 4 * group ``g`` + ``t``, as the PTX ISA lays out
m16n8k16 fragments). Scores: A is Q (query heads x channels), B is K^T. The
channel order inside a product does not change it, so lane ``t`` takes the
contiguous quarter ``[t * D/4, (t + 1) * D/4)`` of each key row and of each
query row: a K row's B fragments and Q's A fragments are plain 32-bit words
of those loads. Output: A is P, whose fragments are the score fragments'
lanes as they stand (FlashAttention-2's reuse); B is V with the output
columns permuted so that lane group ``g`` loads the contiguous ``[g * D/8,
(g + 1) * D/8)`` of four key rows and a byte permute pairs two keys in a
word. P is rounded to fp16 for that product (the scores, sums and outputs
stay float32): outputs differ from the CPU's by about fp16's rounding.

``TC_PRIMITIVES`` is the only block naming tensor-core and load instructions;
the tests' emulator (``tests/cuda_emulation.py``) swaps it for host versions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .attention_cuda import params
from .gqa_cuda import GQA_SOURCE
from .gqa_geometry import TC_MERGE_THREADS

TC_PRIMITIVES = r"""
// d (16x8, fp32) += a (16x16, fp16) * b (16x8, fp16): mma.m16n8k16's fragments, as the PTX
// ISA lays them out (a: 4 words, b: 2 words, d: 4 floats per lane).
__device__ __forceinline__ void tc_mma(float* d, const unsigned* a, const unsigned* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// The same with A's rows 8-15 zero (at most 8 query heads): d holds rows 0-7 only.
__device__ __forceinline__ void tc_mma_top(float* d, unsigned a0, unsigned a2,
                                           const unsigned* b) {
  float z2 = 0.f, z3 = 0.f;
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(z2), "+f"(z3)
      : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b[0]), "r"(b[1]));
}
// Two floats as one fp16x2 word, rounded to nearest even (lo in the low half).
__device__ __forceinline__ unsigned tc_pack(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&h);
}
// 16 bytes of K or V, cached in L2 only: read once, and coherent with the new row a block
// wrote before its barrier.
__device__ __forceinline__ uint4 tc_load(const void* p) {
  return __ldcg(reinterpret_cast<const uint4*>(p));
}
__device__ __forceinline__ unsigned tc_perm(unsigned x, unsigned y, unsigned s) {
  return __byte_perm(x, y, s);
}
// A point the compiler moves no memory access across.
__device__ __forceinline__ void tc_order() { asm volatile("" ::: "memory"); }
// Lets the next kernel, where it is launched as a programmatic dependent (the merge, the GEMV
// of the attention output: launch.Launcher(dependent=True)), start now: it prefetches what no
// kernel of the step writes, then waits for this kernel's results itself. No kernel launched
// without that attribute is affected; a no-op before sm_90.
__device__ __forceinline__ void tc_pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// These kernels are launched as programmatic dependents themselves: nothing an earlier kernel
// writes (Q, K, V, the lengths, positions, caches, outputs) is read or written before this;
// only the parameter block, which the host wrote when the node was built, comes before it.
__device__ __forceinline__ void tc_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
"""

ATT_DECODE = params(
    "AttDecode",
    i64="qsb qsh ksb ksh kss vsb vsh vss ysb ysh msb msh past",
    i32="B nh nkv Sk causal left right mask_cols has_mask nonpad_offset nsplit rows nrg ktile",
    f32="scale softcap",
)

DECODE_TC_SOURCE = (
    GQA_SOURCE
    + ATT_DECODE.source
    + TC_PRIMITIVES
    + r"""
// Up to 16 query heads' scores against one 16-key tile: s[n][.] holds keys n*8 + 2t + {0,1}
// of rows g (and g + 8 when ROWS == 16). qa/qb: Q's words for rows g / g + 8 (k-step ks at
// [ks][0..1]); kw[n]: the words of key n*8 + g, channels [t*D/4, (t+1)*D/4).
template <int D, int ROWS>
__device__ __forceinline__ void tc_scores(float (*s)[ROWS / 4], const unsigned (*qa)[2],
                                          const unsigned (*qb)[2], const unsigned (*kw)[D / 8]) {
#pragma unroll
  for (int n = 0; n < 2; ++n) {
#pragma unroll
    for (int i = 0; i < ROWS / 4; ++i) s[n][i] = 0.f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const unsigned b[2] = {kw[n][2 * ks], kw[n][2 * ks + 1]};
      if (ROWS == 16) {
        const unsigned a[4] = {qa[ks][0], qb[ks][0], qa[ks][1], qb[ks][1]};
        tc_mma(s[n], a, b);
      } else {
        tc_mma_top(s[n], qa[ks][0], qa[ks][1], b);
      }
    }
  }
}

// One tile's loads, keys ks elements apart: K (kw[n] = key n*8 + g, channels [t*D/4, +D/4))
// and V (vw[k] = key (k>>1)*8 + 2t + (k&1), channels [g*D/8, +D/8)); keys at or past `end`
// read as zeros (rows past a row's length may hold anything: NaN times a zero weight would
// still be NaN).
// `skip`: a key read as zeros here (the new row, not yet written: tc_patch_k/v fill it in).
template <typename T, int D>
__device__ __forceinline__ void tc_load_k(unsigned (*kw)[D / 8], const T* kb, long long ks,
                                          int j0, int end, int g, int t, int skip = -1) {
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    const int key = j0 + n * 8 + g;
#pragma unroll
    for (int q = 0; q < D / 32; ++q) {
      uint4 u = make_uint4(0u, 0u, 0u, 0u);
      if (key < end && key != skip) u = tc_load(kb + key * ks + t * (D / 4) + 8 * q);
      kw[n][4 * q] = u.x;
      kw[n][4 * q + 1] = u.y;
      kw[n][4 * q + 2] = u.z;
      kw[n][4 * q + 3] = u.w;
    }
  }
}

template <typename T, int D>
__device__ __forceinline__ void tc_load_v(unsigned (*vw)[D / 16], const T* vb, long long ks,
                                          int j0, int end, int g, int t, int skip = -1) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int key = j0 + (k >> 1) * 8 + 2 * t + (k & 1);
#pragma unroll
    for (int q = 0; q < D / 64; ++q) {
      uint4 u = make_uint4(0u, 0u, 0u, 0u);
      if (key < end && key != skip) u = tc_load(vb + key * ks + g * (D / 8) + 8 * q);
      vw[k][4 * q] = u.x;
      vw[k][4 * q + 1] = u.y;
      vw[k][4 * q + 2] = u.z;
      vw[k][4 * q + 3] = u.w;
    }
  }
}

// The words of key `key` in a tile loaded from j0 (tc_load_k/v's layout), taken from the row
// staged in shared memory (kn, vn: D halves each).
template <typename T, int D>
__device__ __forceinline__ void tc_patch(unsigned (*kw)[D / 8], unsigned (*vw)[D / 16],
                                         const T* kn, const T* vn, int j0, int key, int g,
                                         int t) {
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    if (j0 + n * 8 + g != key) continue;
#pragma unroll
    for (int q = 0; q < D / 32; ++q) {
      const uint4 u = *reinterpret_cast<const uint4*>(kn + t * (D / 4) + 8 * q);
      kw[n][4 * q] = u.x;
      kw[n][4 * q + 1] = u.y;
      kw[n][4 * q + 2] = u.z;
      kw[n][4 * q + 3] = u.w;
    }
  }
  if (vw == nullptr) return;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    if (j0 + (k >> 1) * 8 + 2 * t + (k & 1) != key) continue;
#pragma unroll
    for (int q = 0; q < D / 64; ++q) {
      const uint4 u = *reinterpret_cast<const uint4*>(vn + g * (D / 8) + 8 * q);
      vw[k][4 * q] = u.x;
      vw[k][4 * q + 1] = u.y;
      vw[k][4 * q + 2] = u.z;
      vw[k][4 * q + 3] = u.w;
    }
  }
}

// Q's A-fragment words for rows g (qa) and g + 8 (qb) from the staged (ROWS x D) fp16 rows:
// k-step ks takes channels t*D/4 + 4ks .. + 3 (the same quarter a lane takes of each key).
// Read through a volatile pointer where they are re-read per tile (D = 256), so they are
// not hoisted back into registers.
template <int D, int ROWS>
__device__ __forceinline__ void tc_q_words(unsigned (*qa)[2], unsigned (*qb)[2],
                                           const unsigned* qs, int g, int t) {
  const volatile unsigned* q = qs;
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const int w = (g * D + t * (D / 4) + 4 * ks) >> 1;
    qa[ks][0] = q[w];
    qa[ks][1] = q[w + 1];
    if (ROWS == 16) {
      qb[ks][0] = q[w + 4 * D];
      qb[ks][1] = q[w + 4 * D + 1];
    }
  }
}

// The per-warp state of the online softmax: running max m and (lane-partial) sum l of rows g
// and g + 8, and the output fragments (n-tile n: columns 2t, 2t + 1 are channels
// 2t*D/8 + n and (2t+1)*D/8 + n).
template <int D, int ROWS>
struct TcState {
  float m[2], l[2];
  float acc[D / 8][ROWS / 4];
};

// A tile's scores (masked ones -inf) through the online softmax: the running max and sum
// updated, the output rescaled, pa set to P's A fragments (fp16).
template <int D, int ROWS>
__device__ __forceinline__ void tc_online(TcState<D, ROWS>& st, unsigned* pa,
                                          float (*s)[ROWS / 4]) {
  constexpr int AR = ROWS / 4;
  float mx[2] = {ONNXEP_NEG_INF, ONNXEP_NEG_INF};
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int i = 0; i < AR; ++i) mx[i >> 1] = fmaxf(mx[i >> 1], s[n][i]);
#pragma unroll
  for (int u = 0; u < AR / 2; ++u) {
    mx[u] = fmaxf(mx[u], __shfl_xor_sync(0xffffffffu, mx[u], 1));
    mx[u] = fmaxf(mx[u], __shfl_xor_sync(0xffffffffu, mx[u], 2));
    const float mn = fmaxf(st.m[u], mx[u]);
    const float alpha = st.m[u] == ONNXEP_NEG_INF ? 0.f : expf(st.m[u] - mn);
    st.m[u] = mn;
    st.l[u] *= alpha;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      st.acc[n][2 * u] *= alpha;
      st.acc[n][2 * u + 1] *= alpha;
    }
  }
#pragma unroll
  for (int n = 0; n < 2; ++n) {
#pragma unroll
    for (int i = 0; i < AR; ++i) {
      const float mn = st.m[i >> 1];
      const float p = mn == ONNXEP_NEG_INF ? 0.f : expf(s[n][i] - mn);
      s[n][i] = p;
      st.l[i >> 1] += p;
    }
  }
  pa[0] = tc_pack(s[0][0], s[0][1]);
  pa[2] = tc_pack(s[1][0], s[1][1]);
  if (ROWS == 16) {
    pa[1] = tc_pack(s[0][AR - 2], s[0][AR - 1]);
    pa[3] = tc_pack(s[1][AR - 2], s[1][AR - 1]);
  }
}

// The tile's share of the output: P (fp16) times its V rows, channel g*D/8 + n of keys 2t,
// 2t+1 (and 2t+8, 2t+9) paired from the halves of their loaded words.
template <int D, int ROWS>
__device__ __forceinline__ void tc_accumulate(TcState<D, ROWS>& st, const unsigned* pa,
                                              const unsigned (*vw)[D / 16]) {
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    const int w = n >> 1;
    const unsigned sel = (n & 1) ? 0x7632u : 0x5410u;
    const unsigned bw[2] = {tc_perm(vw[0][w], vw[1][w], sel), tc_perm(vw[2][w], vw[3][w], sel)};
    if (ROWS == 16) {
      tc_mma(st.acc[n], pa, bw);
    } else {
      tc_mma_top(st.acc[n], pa[0], pa[2], bw);
    }
  }
}

// A block's keys [js, je) through its 4 warps (16-key tiles in turn), from the Q rows staged
// in qs; score(s, j0) masks and scales a tile's raw products in place (the op's rules). The
// next tile's loads are in flight while one computes where the registers allow it (two named
// buffers, so they stay registers); at D = 256 Q is re-read per tile and V loaded once the
// scores no longer need K's. k0/v0 hold tile `warp`'s loads (tc_first_loads: K, and V where
// D <= 128), issued by the caller before it staged Q.
template <typename T, int D, int ROWS, typename Score>
__device__ __forceinline__ void tc_stream(TcState<D, ROWS>& st, const unsigned* qs,
                                          const T* kb, const T* vb, long long kss,
                                          long long vss, int js, int je,
                                          unsigned (*k0)[D / 8], unsigned (*v0)[D / 16],
                                          const Score& score) {
  constexpr int NW = 4, AR = ROWS / 4;
  constexpr bool QREG = D <= 128, DOUBLE = D * ROWS <= ONNXEP_TC_DOUBLE_MAX;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int ntiles = (je - js + 15) / 16;
  unsigned qa[D / 16][2], qb[D / 16][2], pa[4];
  float s[2][AR];
  if (QREG) tc_q_words<D, ROWS>(qa, qb, qs, g, t);
  st.m[0] = st.m[1] = ONNXEP_NEG_INF;
  st.l[0] = st.l[1] = 0.f;
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int i = 0; i < AR; ++i) st.acc[n][i] = 0.f;
  if (DOUBLE) {
    unsigned k1[2][D / 8], v1[4][D / 16];
    int it = warp;
    while (it < ntiles) {
      if (it + NW < ntiles) {
        tc_load_k<T, D>(k1, kb, kss, js + (it + NW) * 16, je, g, t);
        tc_load_v<T, D>(v1, vb, vss, js + (it + NW) * 16, je, g, t);
      }
      tc_scores<D, ROWS>(s, qa, qb, k0);
      score(s, js + it * 16);
      tc_online<D, ROWS>(st, pa, s);
      tc_accumulate<D, ROWS>(st, pa, v0);
      it += NW;
      if (it >= ntiles) break;
      if (it + NW < ntiles) {
        tc_load_k<T, D>(k0, kb, kss, js + (it + NW) * 16, je, g, t);
        tc_load_v<T, D>(v0, vb, vss, js + (it + NW) * 16, je, g, t);
      }
      tc_scores<D, ROWS>(s, qa, qb, k1);
      score(s, js + it * 16);
      tc_online<D, ROWS>(st, pa, s);
      tc_accumulate<D, ROWS>(st, pa, v1);
      it += NW;
    }
  } else {
    for (int it = warp; it < ntiles; it += NW) {
      const int j0 = js + it * 16;
      if (it != warp) {
        tc_load_k<T, D>(k0, kb, kss, j0, je, g, t);
        if (QREG) tc_load_v<T, D>(v0, vb, vss, j0, je, g, t);
      }
      if (!QREG) tc_q_words<D, ROWS>(qa, qb, qs, g, t);
      tc_scores<D, ROWS>(s, qa, qb, k0);
      score(s, j0);
      tc_online<D, ROWS>(st, pa, s);
      if (!QREG) {
        tc_order();  // K's registers are free before V's loads start
        tc_load_v<T, D>(v0, vb, vss, j0, je, g, t);
      }
      tc_accumulate<D, ROWS>(st, pa, v0);
    }
  }
}

// The first tile's loads of warp `warp` (K, and V where tc_stream keeps it with K: D <= 128),
// issued as soon as the block knows its keys, so they are in flight while Q is staged. `skip`
// as tc_load_k's.
template <typename T, int D, int ROWS>
__device__ __forceinline__ void tc_first_loads(unsigned (*k0)[D / 8], unsigned (*v0)[D / 16],
                                               const T* kb, const T* vb, long long kss,
                                               long long vss, int js, int je, int skip = -1) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (js + warp * 16 < je) {
    tc_load_k<T, D>(k0, kb, kss, js + warp * 16, je, lane >> 2, lane & 3, skip);
    if (D <= 128) tc_load_v<T, D>(v0, vb, vss, js + warp * 16, je, lane >> 2, lane & 3, skip);
  }
}

// The warps' partials merged in a fixed order (bit-stable): the block's max M and sum L per
// row, each warp's output rescaled to M, then warps 2 and 3 added into 0 and 1, then 1 into
// 0. ms: 2 * 4 * ROWS floats, xs: 2 * D/8 * ROWS/4 * 32. Afterwards warp 0 holds the block's.
template <int D, int ROWS>
__device__ __forceinline__ void tc_block_merge(TcState<D, ROWS>& st, float* ms, float* xs,
                                               float* M, float* L) {
  constexpr int NW = 4, AR = ROWS / 4, NT = D / 8;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int u = 0; u < AR / 2; ++u) {
    st.l[u] += __shfl_xor_sync(0xffffffffu, st.l[u], 1);
    st.l[u] += __shfl_xor_sync(0xffffffffu, st.l[u], 2);
    if (t == 0) {
      ms[warp * ROWS + g + 8 * u] = st.m[u];
      ms[(NW + warp) * ROWS + g + 8 * u] = st.l[u];
    }
  }
  __syncthreads();
#pragma unroll
  for (int u = 0; u < AR / 2; ++u) {
    const int r = g + 8 * u;
    M[u] = ONNXEP_NEG_INF;
    for (int w = 0; w < NW; ++w) M[u] = fmaxf(M[u], ms[w * ROWS + r]);
    L[u] = 0.f;
    for (int w = 0; w < NW; ++w) {
      const float mw = ms[w * ROWS + r];
      if (mw != ONNXEP_NEG_INF) L[u] = fmaf(ms[(NW + w) * ROWS + r], expf(mw - M[u]), L[u]);
    }
    const float f = st.m[u] == ONNXEP_NEG_INF ? 0.f : expf(st.m[u] - M[u]);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      st.acc[n][2 * u] *= f;
      st.acc[n][2 * u + 1] *= f;
    }
  }
  for (int round = 0; round < 2; ++round) {
    const int senders = round == 0 ? 2 : 1;  // warps [senders, 2*senders) send to w - senders
    if (warp >= senders && warp < 2 * senders) {
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int i = 0; i < AR; ++i)
          xs[((warp - senders) * NT * AR + n * AR + i) * 32 + lane] = st.acc[n][i];
    }
    __syncthreads();
    if (warp < senders) {
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int i = 0; i < AR; ++i)
          st.acc[n][i] += xs[(warp * NT * AR + n * AR + i) * 32 + lane];
    }
    __syncthreads();
  }
}

// Warp 0's result for its rows r < nrow: the finished output (a row held by one split,
// nsb == 1) at y + y0 + r * yrs + channel, or the split's partial: part holds acc
// [nout][nsplit][D] (first, so the merge's 16-byte loads are aligned), then m, then l, each
// [nout][nsplit], row o0 + r. sink(r): the row's sink logit (or 0 without one).
template <typename T, int D, int ROWS, typename Sink>
__device__ __forceinline__ void tc_write(const TcState<D, ROWS>& st, const float* M,
                                         const float* L, int nrow, int nsb, int c, int nsplit,
                                         long long nout, long long o0, float* part, T* y,
                                         long long y0, long long yrs, bool has_sink,
                                         const Sink& sink) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int i = 0; i < ROWS / 4; ++i) {
    const int u = i >> 1, r = g + 8 * u;
    if (r >= nrow) continue;
    const long long orow = o0 + r;
    const float sk = sink(r);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const int ch = (2 * t + (i & 1)) * (D / 8) + n;
      if (nsb == 1) {
        y[y0 + r * yrs + ch] = from_f<T>(attn_finish(st.acc[n][i], M[u], L[u], has_sink, sk));
      } else {
        part[(orow * nsplit + c) * D + ch] = st.acc[n][i];
      }
    }
    if (nsb > 1 && t == 0 && (i & 1) == 0) {
      const long long acc_n = nout * nsplit * D;
      part[acc_n + orow * nsplit + c] = M[u];
      part[acc_n + nout * nsplit + orow * nsplit + c] = L[u];
    }
  }
}

// GroupQueryAttention's scores of a tile: attn_score's scaling, softcap and bias, masked
// past the block's keys, for padding rows, by the causal frontier and the local window.
template <typename T, int ROWS>
struct GqaTcScore {
  const GqaDecode* prm;
  const T* bias;
  long long row;
  int end, nrow, h0, b;
  __device__ __forceinline__ void operator()(float (*s)[ROWS / 4], int j0) const {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const long long bsb = prm->bsb, bsh = prm->bsh, bsj = prm->bsj;
    const int causal = prm->causal, window = prm->window;
    const float scale = prm->scale, softcap = prm->softcap;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int i = 0; i < ROWS / 4; ++i) {
        const int r = g + 8 * (i >> 1);
        const int key = j0 + n * 8 + 2 * t + (i & 1);
        float x = ONNXEP_NEG_INF;
        if (key < end && r < nrow && (!causal || key <= row) &&
            (window < 0 || row - key < window))
          x = attn_score<T>(s[n][i], scale, softcap, bias,
                            b * bsb + (long long)(h0 + r) * bsh + key * bsj);
        s[n][i] = x;
      }
    }
  }
};

template <typename T>
struct GqaSink {
  const T* sink;
  int h0;
  __device__ __forceinline__ float operator()(int r) const {
    return sink != nullptr ? to_f(sink[h0 + r]) : 0.f;
  }
};

struct NoSink {
  __device__ __forceinline__ float operator()(int) const { return 0.f; }
};

// GroupQueryAttention's single-token decode (see the module's docstring). Block (split c, KV
// head hk x row group rg, batch b), 4 warps; query heads h0 + r, r < nrow (h0 = hk*G +
// rg*rows). The new token's K/V row (position P = T - Q) is written by the blocks whose slice
// holds it. At a short context a step's attention is a chain of dependent loads, so each
// link is issued as early as it can be: the first tile's K and V right after the lengths
// (the new row, not yet written, skipped), Q and the new row with the rotary tables
// together (16 bytes a thread where `vec`: the host checked the heads, offsets, row strides,
// the rotary split and the arrays' alignment), and the new row taken from shared memory.
template <typename T, int D, int ROWS>
__global__ void __launch_bounds__(128) gqa_decode_tc(
    const T* __restrict__ qsrc, const T* __restrict__ ksrc, const T* __restrict__ vsrc,
    T* kc, T* vc, const int* __restrict__ seqlens_k, const int* __restrict__ q_seqlens,
    const T* __restrict__ cosc, const T* __restrict__ sinc,
    const long long* __restrict__ pos_ids, const T* __restrict__ bias,
    const T* __restrict__ sink, float* __restrict__ part, T* __restrict__ y, int* flag,
    const GqaDecode* __restrict__ prm, long long vec) {
  extern __shared__ float smem[];
  tc_pdl_trigger();
  constexpr int V = 16 / sizeof(T), U = D / V;  // 16-byte chunks of a head row
  const long long k_off = prm->k_off, v_off = prm->v_off;
  const long long q_row = prm->q_row, k_row = prm->k_row, v_row = prm->v_row;
  const int B = prm->B, nh = prm->nh, nkv = prm->nkv, C = prm->C;
  const int kv_limit = prm->kv_limit, nsplit = prm->nsplit, rows = prm->rows, nrg = prm->nrg;
  const int rot = prm->rot, interleaved = prm->interleaved, pos_mode = prm->pos_mode;
  const int cache_rows = prm->cache_rows, smooth = prm->smooth, node = prm->node;
  const int ktile = prm->ktile;
  tc_pdl_wait();
  const int G = nh / nkv;
  const int b = blockIdx.z, hk = blockIdx.y / nrg, rg = blockIdx.y - (blockIdx.y / nrg) * nrg;
  const int c = blockIdx.x;
  const int h0 = hk * G + rg * rows, nrow = imin(rows, G - rg * rows);
  unsigned* qs = reinterpret_cast<unsigned*>(smem);  // ROWS x D halves
  float* ms = smem + ROWS * D / 2;
  float* xs = ms + 8 * ROWS;
  T* kn = reinterpret_cast<T*>(xs + 2 * (D / 8) * (ROWS / 4) * 32);  // the new K row, rotated
  T* vn = kn + D;                                                     // and its V row

  int Tb, Qb, Pb;
  batch_lengths(seqlens_k, q_seqlens, b, 1, Tb, Qb, Pb);
  const long long row = Pb;  // the new token's cache row and the query's position
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    gqa_check_lengths(flag, node, seqlens_k, q_seqlens, b, B, 1, kv_limit, C);
    if (rot > 0 && Qb > 0)
      gqa_check_position(flag, node, pos_mode, pos_ids, b, B, 1, 0, row, cache_rows);
  }
  const long long kv0 = ((long long)b * nkv + hk) * C * D;
  const int kv_end = imax(0, imin(imin(Tb, kv_limit), C));
  const int chunk = split_chunk(kv_end, nsplit, ktile);
  const int nsb = imax(1, (kv_end + chunk - 1) / chunk);  // splits this row uses
  const bool writer = Qb > 0 && row >= 0 && row < C && c == imin((int)(row / chunk), nsplit - 1);
  if (c >= nsb && !writer) return;  // a split this row does not use
  const int js = c * chunk, je = imin(kv_end, js + chunk);
  T* kb = kc + kv0;
  T* vb = vc + kv0;
  const int skip = writer ? (int)row : -1;
  unsigned k0[2][D / 8], v0[4][D / 16];
  if (c < nsb) tc_first_loads<T, D, ROWS>(k0, v0, kb, vb, D, D, js, je, skip);
  const long long p = rope_row(rope_position(pos_mode, pos_ids, b, 1, 0, row), cache_rows);
  const T* cr = cosc + p * (rot >> 1);
  const T* sr = sinc + p * (rot >> 1);
  const T* qb0 = qsrc + (long long)b * q_row + (long long)h0 * D;
  const T* kh = ksrc + k_off + (long long)b * k_row + (long long)hk * D;
  const T* vh = vsrc + v_off + (long long)b * v_row + (long long)hk * D;
  T* qh = reinterpret_cast<T*>(qs);
  if (vec) {  // Q's rows, then (the writer) the new K row, then its V row, a chunk a thread
    const int nq = ROWS * U, n = nq + (writer ? 2 * U : 0);
    for (int idx = threadIdx.x; idx < n; idx += blockDim.x) {
      const int r = idx / U, d0 = (idx - r * U) * V;
      if (r < ROWS && r >= nrow) {
        *reinterpret_cast<uint4*>(qh + r * D + d0) = make_uint4(0u, 0u, 0u, 0u);
        continue;
      }
      const bool is_v = r == ROWS + 1;
      const T* head = r < ROWS ? qb0 + (long long)r * D : is_v ? vh : kh;
      uint4 w = *reinterpret_cast<const uint4*>(head + d0);
      if (!is_v && d0 < rot) {
        const int half = rot >> 1, pd = interleaved ? d0 : d0 < half ? d0 + half : d0 - half;
        w = rope_chunk<T>(w, *reinterpret_cast<const uint4*>(head + pd), cr, sr, d0, half,
                          interleaved);
      }
      if (r < ROWS) {
        *reinterpret_cast<uint4*>(qh + r * D + d0) = w;
      } else {
        *reinterpret_cast<uint4*>((is_v ? vn : kn) + d0) = w;
        *reinterpret_cast<uint4*>((is_v ? vb : kb) + row * D + d0) = w;
      }
    }
  } else {
    for (int idx = threadIdx.x; idx < ROWS * D; idx += blockDim.x) {
      const int r = idx / D, d = idx - r * D;
      qh[idx] = r < nrow ? rotated<T>(qb0 + (long long)r * D, d, rot, interleaved, cosc, sinc, p)
                         : from_f<T>(0.f);
    }
    if (writer) {
      for (int d = threadIdx.x; d < D; d += blockDim.x) {
        const T kv = rotated<T>(kh, d, rot, interleaved, cosc, sinc, p), vv = vh[d];
        kn[d] = kv;
        vn[d] = vv;
        kb[row * D + d] = kv;
        vb[row * D + d] = vv;
      }
    }
  }
  __syncthreads();  // Q and the new row staged (and written: later tiles load it from L2)
  if (c >= nsb) return;
  if (writer && js + (threadIdx.x >> 5) * 16 <= row && row < js + (threadIdx.x >> 5) * 16 + 16)
    tc_patch<T, D>(k0, D <= 128 ? v0 : nullptr, kn, vn, js + (threadIdx.x >> 5) * 16, (int)row,
                   (threadIdx.x & 31) >> 2, threadIdx.x & 3);
  TcState<D, ROWS> st;
  const GqaTcScore<T, ROWS> score{prm, bias, row, je, nrow, h0, b};
  tc_stream<T, D, ROWS>(st, qs, kb, vb, D, D, js, je, k0, v0, score);
  float M[2], L[2];
  tc_block_merge<D, ROWS>(st, ms, xs, M, L);
  if ((threadIdx.x >> 5) != 0) return;
  const long long o0 = (long long)b * nh + h0;
  tc_write<T, D, ROWS>(st, M, L, nrow, nsb, c, nsplit, (long long)B * nh, o0, part, y, o0 * D,
                       D, sink != nullptr || smooth != 0, GqaSink<T>{sink, h0});
}

// Attention's (ONNX 23-25, onnxep) keys a single query row attends: [lo, hi), from the keys
// (Sk, or nonpad_kv_seqlen[b]), the mask's columns, the causal frontier and the windows, the
// row at position pos (the past length, or nonpad - 1 for an external cache).
__device__ __forceinline__ void att_key_range(const AttDecode* prm, const long long* nonpad,
                                              int b, long long& pos, int& lo, int& hi) {
  const int Sk = prm->Sk;
  long long off = prm->past, kv_end = Sk;
  if (nonpad != nullptr) {
    const long long np = nonpad[b];
    kv_end = lclamp(np, 0, Sk);
    if (prm->nonpad_offset) off = np - 1;
  }
  pos = off;
  long long h = kv_end, l = 0;
  if (prm->has_mask && prm->mask_cols < h) h = prm->mask_cols;
  if (prm->causal && pos + 1 < h) h = pos + 1;
  if (prm->right >= 0 && pos + prm->right + 1 < h) h = pos + prm->right + 1;
  if (prm->left >= 0 && pos - prm->left > l) l = pos - prm->left;
  lo = (int)lclamp(l, 0, Sk);
  hi = (int)lclamp(h, lo, Sk);
}

// Attention's scores of a tile: scale and softcap, then a bool mask (as bytes: false masks) or
// an additive one (float32 or float16), masked past the block's keys and for padding rows.
template <int ROWS>
struct AttTcScore {
  const unsigned char* mask_b;
  const float* mask_f;
  const __half* mask_h;
  long long m0, msh;
  float scale, softcap;
  int end, nrow;
  __device__ __forceinline__ void operator()(float (*s)[ROWS / 4], int j0) const {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int n = 0; n < 2; ++n) {
#pragma unroll
      for (int i = 0; i < ROWS / 4; ++i) {
        const int r = g + 8 * (i >> 1);
        const int key = j0 + n * 8 + 2 * t + (i & 1);
        const long long mi = m0 + r * msh + key;
        bool ok = key < end && r < nrow;
        if (ok && mask_b != nullptr) ok = mask_b[mi] != 0;
        float x = ONNXEP_NEG_INF;
        if (ok) {
          x = s[n][i] * scale;
          if (softcap > 0.f) x = tanhf(x / softcap) * softcap;
          if (mask_f != nullptr) x += mask_f[mi];
          if (mask_h != nullptr) x += to_f(mask_h[mi]);
        }
        s[n][i] = x;
      }
    }
  }
};

// ONNX Attention's single-query-row decode on tensor cores (the layout and softmax of
// gqa_decode_tc): block (split c, KV head hk x row group rg, batch b); Q, K, V and Y read
// through their element strides (batch, head, row; channels contiguous), the row's keys
// [lo, hi) (att_key_range) spread over the splits.
template <typename T, int D, int ROWS>
__global__ void __launch_bounds__(128) att_decode_tc(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
    const unsigned char* __restrict__ mask_b, const float* __restrict__ mask_f,
    const __half* __restrict__ mask_h, const long long* __restrict__ nonpad,
    float* __restrict__ part, T* __restrict__ y, const AttDecode* __restrict__ prm) {
  extern __shared__ float smem[];
  tc_pdl_trigger();
  const int B = prm->B, nh = prm->nh, nkv = prm->nkv, nsplit = prm->nsplit, rows = prm->rows;
  const int nrg = prm->nrg, G = nh / nkv;
  tc_pdl_wait();
  const int b = blockIdx.z, hk = blockIdx.y / nrg, rg = blockIdx.y - (blockIdx.y / nrg) * nrg;
  const int c = blockIdx.x;
  const int h0 = hk * G + rg * rows, nrow = imin(rows, G - rg * rows);
  unsigned* qs = reinterpret_cast<unsigned*>(smem);
  float* ms = smem + ROWS * D / 2;
  float* xs = ms + 8 * ROWS;
  long long pos;
  int lo, hi;
  att_key_range(prm, nonpad, b, pos, lo, hi);
  const int chunk = split_chunk(hi - lo, nsplit, prm->ktile);
  const int nsb = imax(1, (hi - lo + chunk - 1) / chunk);
  if (c >= nsb) return;
  const int js = lo + c * chunk, je = imin(hi, js + chunk);
  const T* kb = k + b * prm->ksb + hk * prm->ksh;
  const T* vb = v + b * prm->vsb + hk * prm->vsh;
  unsigned k0[2][D / 8], v0[4][D / 16];
  tc_first_loads<T, D, ROWS>(k0, v0, kb, vb, prm->kss, prm->vss, js, je);
  T* qh = reinterpret_cast<T*>(qs);
  for (int idx = threadIdx.x; idx < ROWS * D; idx += blockDim.x) {
    const int r = idx / D, d = idx - r * D;
    qh[idx] = r < nrow ? q[b * prm->qsb + (h0 + r) * prm->qsh + d] : from_f<T>(0.f);
  }
  __syncthreads();
  TcState<D, ROWS> st;
  const AttTcScore<ROWS> score{mask_b, mask_f, mask_h, b * prm->msb + h0 * prm->msh, prm->msh,
                               prm->scale, prm->softcap, je, nrow};
  tc_stream<T, D, ROWS>(st, qs, kb, vb, prm->kss, prm->vss, js, je, k0, v0, score);
  float M[2], L[2];
  tc_block_merge<D, ROWS>(st, ms, xs, M, L);
  if ((threadIdx.x >> 5) != 0) return;
  tc_write<T, D, ROWS>(st, M, L, nrow, nsb, c, nsplit, (long long)B * nh, (long long)b * nh + h0,
                       part, y, b * prm->ysb + h0 * prm->ysh, prm->ysh, false, NoSink{});
}

// The nsb splits of one output row (partials at bh of nout rows) merged into out[0, D).
// A merge is latency, not bandwidth: 125 partials a row at 32k keys, each a load that the
// next step waits for. So nothing waits for a block-wide maximum before the partials are
// read: groups of D/4 threads (a thread four channels, one 16-byte load) take every ng-th
// split, eight at a time with their maxes and sums loaded alongside, and keep an online
// softmax of their own (rescaled to each batch's running maximum); the groups' (max, sum,
// output) then meet in shared memory (red: 3 * ng + 1 + ng * D floats, ng * D <= 4 * nt) in
// a fixed order (bit-stable), with the sink's logit where there is one.
template <typename T>
__device__ __forceinline__ void tc_merge_row(const float* part, long long bh, long long nout,
                                             int nsplit, int nsb, int D, bool has_sink,
                                             float sk, T* out, float* red) {
  const long long acc_n = nout * nsplit * D;  // tc_write's layout: outputs, maxes, sums
  const float* pm = part + acc_n + bh * nsplit;
  const float* pl = part + acc_n + nout * nsplit + bh * nsplit;
  const float4* pa = reinterpret_cast<const float4*>(part + bh * nsplit * D);
  const int nt = blockDim.x, lg = D >> 2, ng = imax(1, nt / lg);
  const int g = threadIdx.x / lg, c4 = threadIdx.x - g * lg;
  float* gm = red;
  float* gl = red + ng;
  float* gs = red + 2 * ng;
  if (g < ng) {
    float M = ONNXEP_NEG_INF, L = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int k = g; k < nsb; k += 8 * ng) {
      float m[8], l[8];
      float4 v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int kj = k + j * ng;
        const bool in = kj < nsb;
        m[j] = in ? pm[kj] : ONNXEP_NEG_INF;
        l[j] = in ? pl[kj] : 0.f;
        v[j] = in ? pa[(long long)kj * lg + c4] : make_float4(0.f, 0.f, 0.f, 0.f);
      }
      float mb = M;
#pragma unroll
      for (int j = 0; j < 8; ++j) mb = fmaxf(mb, m[j]);
      if (mb == ONNXEP_NEG_INF) continue;  // the group's splits so far saw no key
      const float s = expf(M - mb);  // 0 while M is still -inf (acc and L are 0 then)
      acc.x *= s;
      acc.y *= s;
      acc.z *= s;
      acc.w *= s;
      L *= s;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float w = m[j] == ONNXEP_NEG_INF ? 0.f : expf(m[j] - mb);
        L = fmaf(w, l[j], L);
        acc.x = fmaf(w, v[j].x, acc.x);
        acc.y = fmaf(w, v[j].y, acc.y);
        acc.z = fmaf(w, v[j].z, acc.z);
        acc.w = fmaf(w, v[j].w, acc.w);
      }
      M = mb;
    }
    if (c4 == 0) {
      gm[g] = M;
      gl[g] = L;
    }
    float* o = gs + g * D + 4 * c4;
    o[0] = acc.x;
    o[1] = acc.y;
    o[2] = acc.z;
    o[3] = acc.w;
  }
  __syncthreads();
  // The groups' weights and the sum once, by warp 0 (a thread per group), so each channel
  // below is ng multiply-adds out of shared memory: not ng exponentials a channel.
  float* gw = gs + ng * D;  // ng weights, then the total sum (0 where nothing is live)
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float mx = ONNXEP_NEG_INF;
    for (int j = lane; j < ng; j += 32) mx = fmaxf(mx, gm[j]);
    mx = warp_max(mx);
    const float mf = has_sink ? fmaxf(mx, sk) : mx;
    float lt = 0.f;
    for (int j = lane; j < ng; j += 32) {
      const float w = gm[j] == ONNXEP_NEG_INF ? 0.f : expf(gm[j] - mf);
      gw[j] = w;
      lt = fmaf(w, gl[j], lt);
    }
    lt = warp_sum(lt);
    if (lane == 0) {
      if (has_sink && mf != ONNXEP_NEG_INF) lt += expf(sk - mf);
      gw[ng] = mf != ONNXEP_NEG_INF && lt > 0.f ? lt : 0.f;
    }
  }
  __syncthreads();
  const float lt = gw[ng];
  for (int d = threadIdx.x; d < D; d += nt) {
    float a = 0.f;
    for (int j = 0; j < ng; ++j) a = fmaf(gw[j], gs[j * D + d], a);
    out[d] = from_f<T>(lt > 0.f ? a / lt : 0.f);
  }
}

// GroupQueryAttention's rows held by several splits, one block per row b * nh + h.
template <typename T>
__global__ void __launch_bounds__(TC_MERGE_THREADS) gqa_decode_merge(
    const int* __restrict__ seqlens_k, const T* __restrict__ sink,
    const float* __restrict__ part, T* __restrict__ y, const GqaDecode* __restrict__ prm) {
  extern __shared__ float smem[];  // tc_merge_row's groups: maxes, sums and outputs
  tc_pdl_trigger();
  const int nh = prm->nh, D = prm->D, nsplit = prm->nsplit, B = prm->B;
  const int kv_limit = prm->kv_limit, C = prm->C, ktile = prm->ktile, smooth = prm->smooth;
  tc_pdl_wait();
  const long long bh = blockIdx.x;
  const int b = (int)(bh / nh), h = (int)(bh - (long long)b * nh);
  const int kv_end = imax(0, imin(imin(seqlens_k[b] + 1, kv_limit), C));
  const int chunk = split_chunk(kv_end, nsplit, ktile);
  const int nsb = imax(1, (kv_end + chunk - 1) / chunk);
  if (nsb <= 1) return;  // gqa_decode_tc wrote the row
  const bool has_sink = sink != nullptr || smooth != 0;
  const float sk = sink != nullptr ? to_f(sink[h]) : 0.f;
  tc_merge_row<T>(part, bh, (long long)B * nh, nsplit, nsb, D, has_sink, sk, y + bh * D,
                  smem);
}

// Attention's rows held by several splits, one block per row b * nh + h.
template <typename T, int D>
__global__ void __launch_bounds__(TC_MERGE_THREADS) att_decode_merge(
    const long long* __restrict__ nonpad, const float* __restrict__ part, T* __restrict__ y,
    const AttDecode* __restrict__ prm) {
  extern __shared__ float smem[];
  tc_pdl_trigger();
  const int nh = prm->nh, nsplit = prm->nsplit;
  tc_pdl_wait();
  const long long bh = blockIdx.x;
  const int b = (int)(bh / nh), h = (int)(bh - (long long)b * nh);
  long long pos;
  int lo, hi;
  att_key_range(prm, nonpad, b, pos, lo, hi);
  const int chunk = split_chunk(hi - lo, nsplit, prm->ktile);
  const int nsb = imax(1, (hi - lo + chunk - 1) / chunk);
  if (nsb <= 1) return;  // att_decode_tc wrote the row
  tc_merge_row<T>(part, bh, (long long)prm->B * nh, nsplit, nsb, D, false, 0.f,
                  y + b * prm->ysb + h * prm->ysh, smem);
}
"""
).replace("TC_MERGE_THREADS", str(TC_MERGE_THREADS))


def tc_names(d: int, rows: int) -> tuple[str, str]:
    """GroupQueryAttention's decode kernel for head size ``d`` and ``rows`` (8 or 16), and its
    merge kernel."""
    return f"gqa_decode_tc<__half, {d}, {rows}>", "gqa_decode_merge<__half>"


def att_names(d: int, rows: int) -> tuple[str, str]:
    """Attention's decode and merge kernels for head size ``d`` and ``rows``."""
    return f"att_decode_tc<__half, {d}, {rows}>", f"att_decode_merge<__half, {d}>"


#: The largest D x ROWS whose tiles are double-buffered in registers (two tiles' K and V
#: words a lane): beyond it a tile's loads wait for the one before.
TC_DOUBLE_MAX = 512


#: The kernels' parameters as ``launch.Launcher`` packs them (8 bytes each: pointers, and
#: gqa_decode_tc's ``vec`` as int64), by kernel name up to its template arguments.
TC_SIGNATURES = {
    "gqa_decode_tc": "p" * 16 + "q",
    "gqa_decode_merge": "p" * 5,
    "att_decode_tc": "p" * 10,
    "att_decode_merge": "p" * 4,
}


def tc_kernels(names: tuple[str, str], xp: Any = None) -> tuple:
    """(decode, merge) of ``names`` compiled: a module of those two instantiations only (each
    pair costs about a second of NVRTC, so only what a node uses). Each is called as CuPy calls
    a kernel, ``fn(grid, block, args, shared_mem=...)``. With CuPy as ``xp`` the launches go
    through the driver as programmatic dependents (:func:`dependent_launch`): both kernels
    wait (``tc_pdl_wait``) before they touch what an earlier kernel writes."""
    from onnxep.providers_cuda import nvrtc

    source = f"#define ONNXEP_TC_DOUBLE_MAX {int(TC_DOUBLE_MAX)}\n" + DECODE_TC_SOURCE
    fns = tuple(nvrtc.function(source, n, names) for n in names)
    if getattr(xp, "__name__", "") != "cupy":  # the tests' emulator calls them itself
        return fns
    return tuple(dependent_launch(f, TC_SIGNATURES[n.split("<")[0]]) for f, n in zip(fns, names))


def dependent_launch(fn: Any, signature: str) -> Callable[..., None]:
    """``fn`` (a compiled kernel) called as CuPy calls one, launched by ``launch.Launcher``
    with the programmatic-dependent attribute: arrays become their device pointers, ``None``
    a null pointer, numbers the integers of ``signature``."""
    from ..elementwise import stream_ptr_fn
    from ..launch import Launcher

    launcher = Launcher(fn, signature, dependent=True)
    stream = stream_ptr_fn()

    def call(grid: tuple, block: tuple, args: tuple, shared_mem: int = 0) -> None:
        values = tuple(
            0 if a is None else int(a) if isinstance(a, int | np.integer) else a.data.ptr
            for a in args
        )
        launcher(grid, block[0], values, stream(), shared_mem)

    call.launcher = launcher  # type: ignore[attr-defined]
    return call
