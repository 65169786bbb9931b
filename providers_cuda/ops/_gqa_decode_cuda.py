"""GroupQueryAttention's single-token decode on tensor cores: split-K over the KV cache.

Why a kernel of its own: a decode step reads the whole KV cache once and does
``2 * G`` multiply-adds per element it reads (G query heads per KV head), so
it must stream K and V at the memory's bandwidth, which the CUDA-core kernel
(``gqa_decode`` in ``_gqa_cuda.py``: 32 keys a block staged through shared
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

from ._gqa_cuda import GQA_SOURCE

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
"""

DECODE_TC_SOURCE = (
    GQA_SOURCE
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

// One tile's loads: K (kw[n] = key n*8 + g, channels [t*D/4, +D/4)) and V (vw[k] = key
// (k>>1)*8 + 2t + (k&1), channels [g*D/8, +D/8)); keys at or past `end` read as zeros (rows
// past a row's length may hold anything: NaN times a zero weight would still be NaN).
template <typename T, int D>
__device__ __forceinline__ void tc_load_k(unsigned (*kw)[D / 8], const T* kb, int j0, int end,
                                          int g, int t) {
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    const int key = j0 + n * 8 + g;
#pragma unroll
    for (int q = 0; q < D / 32; ++q) {
      uint4 u = make_uint4(0u, 0u, 0u, 0u);
      if (key < end) u = tc_load(kb + key * D + t * (D / 4) + 8 * q);
      kw[n][4 * q] = u.x;
      kw[n][4 * q + 1] = u.y;
      kw[n][4 * q + 2] = u.z;
      kw[n][4 * q + 3] = u.w;
    }
  }
}

template <typename T, int D>
__device__ __forceinline__ void tc_load_v(unsigned (*vw)[D / 16], const T* vb, int j0, int end,
                                          int g, int t) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int key = j0 + (k >> 1) * 8 + 2 * t + (k & 1);
#pragma unroll
    for (int q = 0; q < D / 64; ++q) {
      uint4 u = make_uint4(0u, 0u, 0u, 0u);
      if (key < end) u = tc_load(vb + key * D + g * (D / 8) + 8 * q);
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

// One tile's scores through the online softmax: masks and scaling as attn_score, the running
// max and sum updated, the output rescaled; pa gets P's A fragments (fp16).
template <typename T, int D, int ROWS>
__device__ __forceinline__ void tc_probs(TcState<D, ROWS>& st, unsigned* pa,
                                         const unsigned (*qa)[2], const unsigned (*qb)[2],
                                         const unsigned (*kw)[D / 8], int j0, int end,
                                         long long row, int nrow, int h0, int g, int t,
                                         const GqaDecode* prm, const T* bias, int b) {
  constexpr int AR = ROWS / 4;
  float s[2][AR];
  tc_scores<D, ROWS>(s, qa, qb, kw);
  const long long bsb = prm->bsb, bsh = prm->bsh, bsj = prm->bsj;
  const int causal = prm->causal, window = prm->window;
  const float scale = prm->scale, softcap = prm->softcap;
  float mx[2] = {ONNXEP_NEG_INF, ONNXEP_NEG_INF};
#pragma unroll
  for (int n = 0; n < 2; ++n) {
#pragma unroll
    for (int i = 0; i < AR; ++i) {
      const int r = g + 8 * (i >> 1);
      const int key = j0 + n * 8 + 2 * t + (i & 1);
      float x = ONNXEP_NEG_INF;
      if (key < end && r < nrow && (!causal || key <= row) && (window < 0 || row - key < window))
        x = attn_score<T>(s[n][i], scale, softcap, bias,
                          b * bsb + (long long)(h0 + r) * bsh + key * bsj);
      s[n][i] = x;
      mx[i >> 1] = fmaxf(mx[i >> 1], x);
    }
  }
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

// Split-K decode on tensor cores (see the module's docstring). Block (split c, KV head hk x
// row group rg, batch b), 4 warps; query heads h0 + r, r < nrow (h0 = hk*G + rg*rows). The
// new token's K/V row (position P = T - Q) is written first by the blocks whose slice holds
// it. part: m, then l, each [B*nh][nsplit], then acc [B*nh][nsplit][D] (natural channel
// order); a row held by one split is written to y at once.
template <typename T, int D, int ROWS>
__global__ void __launch_bounds__(128) gqa_decode_tc(
    const T* __restrict__ qsrc, const T* __restrict__ ksrc, const T* __restrict__ vsrc,
    T* kc, T* vc, const int* __restrict__ seqlens_k, const int* __restrict__ q_seqlens,
    const T* __restrict__ cosc, const T* __restrict__ sinc,
    const long long* __restrict__ pos_ids, const T* __restrict__ bias,
    const T* __restrict__ sink, float* __restrict__ part, T* __restrict__ y, int* flag,
    const GqaDecode* __restrict__ prm) {
  constexpr int NW = 4, AR = ROWS / 4, NT = D / 8;
  // Q from registers up to D = 128; at 256 its fragments are re-read from shared memory
  // (the registers go to the tile's loads).
  constexpr bool QREG = D <= 128;
  extern __shared__ float smem[];
  const long long k_off = prm->k_off, v_off = prm->v_off;
  const long long q_row = prm->q_row, k_row = prm->k_row, v_row = prm->v_row;
  const int B = prm->B, nh = prm->nh, nkv = prm->nkv, C = prm->C;
  const int kv_limit = prm->kv_limit, nsplit = prm->nsplit, rows = prm->rows, nrg = prm->nrg;
  const int rot = prm->rot, interleaved = prm->interleaved, pos_mode = prm->pos_mode;
  const int cache_rows = prm->cache_rows, smooth = prm->smooth, node = prm->node;
  const int G = nh / nkv;
  const int b = blockIdx.z, hk = blockIdx.y / nrg, rg = blockIdx.y - (blockIdx.y / nrg) * nrg;
  const int c = blockIdx.x;
  const int h0 = hk * G + rg * rows, nrow = imin(rows, G - rg * rows);
  unsigned* qs = reinterpret_cast<unsigned*>(smem);  // ROWS x D halves
  float* ms = smem + ROWS * D / 2;                    // NW x ROWS maxes, then NW x ROWS sums
  float* xs = ms + 2 * NW * ROWS;                     // 2 slots of a warp's output fragments

  int Tb, Qb, Pb;
  batch_lengths(seqlens_k, q_seqlens, b, 1, Tb, Qb, Pb);
  const long long row = Pb;  // the new token's cache row and the query's position
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    gqa_check_lengths(flag, node, seqlens_k, q_seqlens, b, B, 1, kv_limit, C);
    if (rot > 0 && Qb > 0)
      gqa_check_position(flag, node, pos_mode, pos_ids, b, B, 1, 0, row, cache_rows);
  }
  const long long p = rope_row(rope_position(pos_mode, pos_ids, b, 1, 0, row), cache_rows);
  const long long kv0 = ((long long)b * nkv + hk) * C * D;
  const int kv_end = imax(0, imin(imin(Tb, kv_limit), C));
  const int chunk = split_chunk(kv_end, nsplit, prm->ktile);
  const int nsb = imax(1, (kv_end + chunk - 1) / chunk);  // splits this row uses
  if (Qb > 0 && row >= 0 && row < C && c == imin((int)(row / chunk), nsplit - 1)) {
    const T* kh = ksrc + k_off + (long long)b * k_row + (long long)hk * D;
    const T* vh = vsrc + v_off + (long long)b * v_row + (long long)hk * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
      kc[kv0 + row * D + d] = rotated<T>(kh, d, rot, interleaved, cosc, sinc, p);
      vc[kv0 + row * D + d] = vh[d];
    }
  }
  if (c >= nsb) return;  // a split this row does not use
  const int js = c * chunk, je = imin(kv_end, js + chunk);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const T* kb = kc + kv0;
  const T* vb = vc + kv0;
  const int ntiles = (je - js + 15) / 16;
  constexpr bool DOUBLE = D * ROWS <= 512;
  unsigned k0[2][D / 8], v0[4][D / 16], pa[4];
  __syncthreads();  // the new row is written: the first tile's loads may start
  if (DOUBLE && warp < ntiles) {  // in flight while Q is staged
    tc_load_k<T, D>(k0, kb, js + warp * 16, je, g, t);
    tc_load_v<T, D>(v0, vb, js + warp * 16, je, g, t);
  }
  T* qh = reinterpret_cast<T*>(qs);
  for (int idx = threadIdx.x; idx < ROWS * D; idx += blockDim.x) {
    const int r = idx / D, d = idx - r * D;
    const T* src = qsrc + (long long)b * q_row + (long long)(h0 + (r < nrow ? r : 0)) * D;
    qh[idx] = r < nrow ? rotated<T>(src, d, rot, interleaved, cosc, sinc, p) : from_f<T>(0.f);
  }
  __syncthreads();  // Q staged

  unsigned qa[D / 16][2], qb[D / 16][2];
  if (QREG) tc_q_words<D, ROWS>(qa, qb, qs, g, t);
  TcState<D, ROWS> st;
  st.m[0] = st.m[1] = ONNXEP_NEG_INF;
  st.l[0] = st.l[1] = 0.f;
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int i = 0; i < AR; ++i) st.acc[n][i] = 0.f;
  if (DOUBLE) {
    // the next tile's loads in flight while one computes (two named buffers, so they stay
    // in registers); the first tile's were issued above
    unsigned k1[2][D / 8], v1[4][D / 16];
    int it = warp;
    while (it < ntiles) {
      if (it + NW < ntiles) {
        tc_load_k<T, D>(k1, kb, js + (it + NW) * 16, je, g, t);
        tc_load_v<T, D>(v1, vb, js + (it + NW) * 16, je, g, t);
      }
      tc_probs<T, D, ROWS>(st, pa, qa, qb, k0, js + it * 16, je, row, nrow, h0, g, t, prm,
                           bias, b);
      tc_accumulate<D, ROWS>(st, pa, v0);
      it += NW;
      if (it >= ntiles) break;
      if (it + NW < ntiles) {
        tc_load_k<T, D>(k0, kb, js + (it + NW) * 16, je, g, t);
        tc_load_v<T, D>(v0, vb, js + (it + NW) * 16, je, g, t);
      }
      tc_probs<T, D, ROWS>(st, pa, qa, qb, k1, js + it * 16, je, row, nrow, h0, g, t, prm,
                           bias, b);
      tc_accumulate<D, ROWS>(st, pa, v1);
      it += NW;
    }
  } else {
    // one tile's registers; at D = 256 Q is re-read per tile, and V is loaded once the
    // scores no longer need K's
    for (int it = warp; it < ntiles; it += NW) {
      const int j0 = js + it * 16;
      tc_load_k<T, D>(k0, kb, j0, je, g, t);
      if (QREG) {
        tc_load_v<T, D>(v0, vb, j0, je, g, t);
      } else {
        tc_q_words<D, ROWS>(qa, qb, qs, g, t);
      }
      tc_probs<T, D, ROWS>(st, pa, qa, qb, k0, j0, je, row, nrow, h0, g, t, prm, bias, b);
      if (!QREG) {
        tc_order();  // K's registers are free before V's loads start
        tc_load_v<T, D>(v0, vb, j0, je, g, t);
      }
      tc_accumulate<D, ROWS>(st, pa, v0);
    }
  }
  // The warps' partials merged in a fixed order (bit-stable): the block's max per row, each
  // warp's output rescaled to it, then warps 2 and 3 added into 0 and 1, then 1 into 0.
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
  float M[2], L[2];
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
  if (warp != 0) return;
  const long long nout = (long long)B * nh;
  const bool has_sink = sink != nullptr || smooth != 0;
#pragma unroll
  for (int i = 0; i < AR; ++i) {
    const int u = i >> 1, r = g + 8 * u;
    if (r >= nrow) continue;
    const long long orow = (long long)b * nh + h0 + r;
    const float sk = sink != nullptr ? to_f(sink[h0 + r]) : 0.f;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const int ch = (2 * t + (i & 1)) * (D / 8) + n;
      if (nsb == 1) {
        y[orow * D + ch] = from_f<T>(attn_finish(st.acc[n][i], M[u], L[u], has_sink, sk));
      } else {
        part[2 * nout * nsplit + (orow * nsplit + c) * D + ch] = st.acc[n][i];
      }
    }
    if (nsb > 1 && t == 0 && (i & 1) == 0) {
      part[orow * nsplit + c] = M[u];
      part[nout * nsplit + orow * nsplit + c] = L[u];
    }
  }
}

// The splits of one output row (block b * nh + h) merged: weights exp(m_k - max) in shared
// memory, then each channel's weighted sum in split order (bit-stable).
template <typename T>
__global__ void __launch_bounds__(128) gqa_decode_merge(
    const int* __restrict__ seqlens_k, const T* __restrict__ sink,
    const float* __restrict__ part, T* __restrict__ y, const GqaDecode* __restrict__ prm) {
  extern __shared__ float smem[];  // nsplit weights, then 32 floats of reduction scratch
  const int B = prm->B, nh = prm->nh, D = prm->D, C = prm->C, kv_limit = prm->kv_limit;
  const int nsplit = prm->nsplit, smooth = prm->smooth;
  const long long bh = blockIdx.x;
  const int b = (int)(bh / nh), h = (int)(bh - (long long)b * nh);
  const int kv_end = imax(0, imin(imin(seqlens_k[b] + 1, kv_limit), C));
  const int chunk = split_chunk(kv_end, nsplit, prm->ktile);
  const int nsb = imax(1, (kv_end + chunk - 1) / chunk);
  if (nsb <= 1) return;  // gqa_decode_tc wrote the row
  const long long nout = (long long)B * nh;
  const float* pm = part + bh * nsplit;
  const float* pl = part + nout * nsplit + bh * nsplit;
  const float* pa = part + 2 * nout * nsplit + bh * nsplit * D;
  float* ws = smem;
  float* red = smem + nsplit;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  float mx = ONNXEP_NEG_INF;
  for (int k = threadIdx.x; k < nsb; k += blockDim.x) mx = fmaxf(mx, pm[k]);
  mx = warp_max(mx);
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  mx = ONNXEP_NEG_INF;
  for (int w = 0; w < nw; ++w) mx = fmaxf(mx, red[w]);
  const bool has_sink = sink != nullptr || smooth != 0;
  const float sk = sink != nullptr ? to_f(sink[h]) : 0.f;
  const float mf = has_sink ? fmaxf(mx, sk) : mx;
  float ls = 0.f;
  for (int k = threadIdx.x; k < nsb; k += blockDim.x) {
    const float w = pm[k] == ONNXEP_NEG_INF ? 0.f : expf(pm[k] - mf);
    ws[k] = w;
    ls = fmaf(w, pl[k], ls);
  }
  ls = warp_sum(ls);
  __syncthreads();  // every warp read red[] above
  if (lane == 0) red[warp] = ls;
  __syncthreads();
  float lt = 0.f;
  for (int w = 0; w < nw; ++w) lt += red[w];
  if (has_sink && mf != ONNXEP_NEG_INF) lt += expf(sk - mf);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float a = 0.f;
    for (int k = 0; k < nsb; ++k) a = fmaf(ws[k], pa[(long long)k * D + d], a);
    y[bh * D + d] = from_f<T>(mf != ONNXEP_NEG_INF && lt > 0.f ? a / lt : 0.f);
  }
}
"""
)


MERGE_NAME = "gqa_decode_merge<__half>"


def tc_names(d: int, rows: int) -> tuple[str, str]:
    """The decode kernel's instantiation for head size ``d`` and ``rows`` (8 or 16), and the
    merge kernel's."""
    return f"gqa_decode_tc<__half, {d}, {rows}>", MERGE_NAME


def tc_kernels(d: int, rows: int) -> tuple:
    """(decode, merge) compiled for head size ``d`` and ``rows``: a module of those two
    instantiations only (each pair costs about a second of NVRTC, so only what a node uses)."""
    from onnxep.providers_cuda import nvrtc

    names = tc_names(d, rows)
    return tuple(nvrtc.function(DECODE_TC_SOURCE, n, names) for n in names)
