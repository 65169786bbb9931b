"""CUDA kernels of GroupQueryAttention (their launch geometry is in ``gqa_geometry.py``).

Layouts: queries, keys and values arrive as (B, S, heads*D) rows (packed QKV
or three inputs); the KV cache is (B, Hkv, C, D) with C its capacity; the
output is (B, S, Hq*D). Per batch row ``b`` everything the CPU kernel derives
from ``seqlens_k`` is derived on the device: ``T = seqlens_k[b] + 1`` valid
keys, ``Q = min(T, S)`` (or ``query_seqlens[b]``) new rows, ``P = T - Q``
cached before them; query row ``s`` sits at position ``P + s``.

A single-token step (decode) is one launch, ``gqa_decode``: rotary on Q and
K, the new K/V row into the cache and split-K flash decoding over the cache,
one block per (split, KV head, row group, batch) reading each K/V row once for
all the query heads of its group (a warp each); when a row is split, the last
of its splits to finish merges them. Longer steps are ``gqa_prepare`` (rotary
on Q and K, Q to a (B, Hq, S, D) buffer, new K/V rows into the cache) then
``gqa_prefill``: one block per (query tile, query head, batch); K/V tiles
staged in shared memory, online softmax, float32 accumulation.

``gqa_kv_fill`` builds a fresh cache (past rows, then zeros) when the present
cache is not the past buffer itself.
"""

from __future__ import annotations

from .attention_cuda import COMMON_SOURCE, instantiations, params

PREPARE = params(
    "GqaPrepare",
    i64="n k_off v_off q_row k_row v_row",
    i32="B S nh nkv D C kv_limit rot interleaved pos_mode cache_rows node",
)
FILL = params("GqaFill", i64="n", i32="C PL D")
ATTN = params(
    "GqaAttn",
    i64="bsb bsh bss bsj",
    i32="S nh nkv D C kv_limit BQ BK smooth window causal",
    f32="scale softcap",
)
DECODE = params(
    "GqaDecode",
    i64="k_off v_off q_row k_row v_row bsb bsh bsj",
    i32="B nh nkv D C kv_limit nsplit rows nrg ktile rot interleaved pos_mode "
    "cache_rows smooth window causal node",
    f32="scale softcap",
)
#: Head channels one lane of gqa_decode accumulates (32 lanes x 8 = the largest head size).
LANE_CHANNELS = 8

GQA_SOURCE = (
    COMMON_SOURCE
    + PREPARE.source
    + FILL.source
    + ATTN.source
    + DECODE.source
    + f"#define GQA_LANE_CHANNELS {LANE_CHANNELS}\n"
    + r"""
// Scaled, soft-capped, biased score of one (query row, key) pair.
template <typename T>
__device__ __forceinline__ float attn_score(float dot, float scale, float softcap,
                                            const T* bias, long long bi) {
  float x = dot * scale;
  if (softcap > 0.f) x = tanhf(x / softcap) * softcap;
  if (bias != nullptr) x += to_f(bias[bi]);
  return x;
}

// Output of a row from its accumulator, running max m and sum l; with a sink
// (head_sink, or 0 for smooth softmax) exp(sink - max) joins the denominator.
// A row that attends nothing gives 0, as on the CPU.
__device__ __forceinline__ float attn_finish(float acc, float m, float l, bool has_sink,
                                             float sink) {
  if (has_sink) {
    const float mf = fmaxf(m, sink);
    const float a = m == ONNXEP_NEG_INF ? 0.f : expf(m - mf);
    return acc * a / (l * a + expf(sink - mf));
  }
  return l > 0.f ? acc / l : 0.f;
}

// Per batch row: the tokens the cache holds after this step (T), the new ones (Q)
// and the position of the first new one (P = T - Q).
__device__ __forceinline__ void batch_lengths(const int* seqlens_k, const int* q_seqlens,
                                              int b, int S, int& tlen, int& qlen, int& plen) {
  tlen = seqlens_k[b] + 1;
  qlen = q_seqlens != nullptr ? q_seqlens[b] : imin(tlen, S);
  plen = tlen - qlen;
}

// Rotary position of token s of batch row b, whose cache row is `row`, as the model gives it
// (rope_row clamps it into the cos/sin cache for the table read).
// pos_mode 0: the row; 1: pos_ids[0] + s; 2: pos_ids[b, s].
__device__ __forceinline__ long long rope_position(int pos_mode, const long long* pos_ids,
                                                   int b, int S, int s, long long row) {
  if (pos_mode == 0) return row;
  if (pos_mode == 1) return pos_ids[0] + s;
  return pos_ids[(long long)b * S + s];
}

// The cos/sin row read for position p: clamped into the cache, as the CPU kernel reads a
// padded query row's; a real token's position outside it is reported (gqa_check_position).
__device__ __forceinline__ long long rope_row(long long p, int cache_rows) {
  return lclamp(p, 0, (long long)cache_rows - 1);
}

// Channel d of a new Q or K head row after rotary at cache row p (channels >= rot as
// they are).
template <typename T>
__device__ __forceinline__ T rotated(const T* head, int d, int rot, int interleaved,
                                     const T* cosc, const T* sinc, long long p) {
  if (d >= rot) return head[d];
  const long long off = p * (rot >> 1);
  return from_f<T>(rope_channel<T>(head, d, rot, interleaved, cosc + off, sinc + off, 1.0f));
}

// One 16-byte chunk of a head row at channel d0 < rot after rotary, from the chunk (own),
// the cos/sin row cr/sr (rot/2 values each) and, without interleaving, the chunk it pairs
// with (partner: channels d0 +- rot/2); interleaved pairs lie inside the chunk. The same
// arithmetic as rope_channel (each product rounded), so the same bits as `rotated`.
template <typename T>
__device__ __forceinline__ uint4 rope_chunk(const uint4& own, const uint4& partner,
                                            const T* cr, const T* sr, int d0, int half,
                                            int interleaved) {
  constexpr int V = 16 / sizeof(T);
  const T* a = reinterpret_cast<const T*>(&own);
  const T* b = reinterpret_cast<const T*>(&partner);
  uint4 ow;
  T* o = reinterpret_cast<T*>(&ow);
  if (interleaved) {
#pragma unroll
    for (int j = 0; j < V / 2; ++j) {
      const float c = to_f(cr[d0 / 2 + j]), sn = to_f(sr[d0 / 2 + j]);
      const float x1 = to_f(a[2 * j]), x2 = to_f(a[2 * j + 1]);
      o[2 * j] = from_f<T>(__fsub_rn(__fmul_rn(c, x1), __fmul_rn(sn, x2)));
      o[2 * j + 1] = from_f<T>(__fadd_rn(__fmul_rn(sn, x1), __fmul_rn(c, x2)));
    }
  } else {
    const bool first = d0 < half;
    const int i0 = first ? d0 : d0 - half;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float c = to_f(cr[i0 + e]), sn = to_f(sr[i0 + e]);
      // x1: the first half's channel, x2: the second's
      const float x1 = to_f(first ? a[e] : b[e]), x2 = to_f(first ? b[e] : a[e]);
      o[e] = from_f<T>(first ? __fsub_rn(__fmul_rn(c, x1), __fmul_rn(sn, x2))
                             : __fadd_rn(__fmul_rn(sn, x1), __fmul_rn(c, x2)));
    }
  }
  return ow;
}

// A batch row's lengths against the step's limits, checked once per row: seqlens_k within
// -1 .. kv_limit - 1 (the tokens attended must fit the cache of C rows and a bias' key
// columns), query_seqlens within 0 .. min(S, T). The kernels read nothing past their
// buffers either way; a bad value is recorded in the error flag.
__device__ __forceinline__ void gqa_check_lengths(int* flag, int node, const int* seqlens_k,
                                                  const int* q_seqlens, int b, int B, int S,
                                                  int kv_limit, int C) {
  const int v = seqlens_k[b];
  if (v < -1 || v >= kv_limit) {
    onnxep_fault(flag, node, ONNXEP_FAULT_KV_LENGTH, 0, v, b, kv_limit, B, C);
    return;
  }
  if (q_seqlens != nullptr) {
    const int q = q_seqlens[b], lim = imin(S, v + 1);
    if (q < 0 || q > lim) onnxep_fault(flag, node, ONNXEP_FAULT_QUERY_LENGTH, 0, q, b, lim, B, S);
  }
}

// A real token's rotary position outside the cos/sin cache, recorded for the first token of
// a run of bad ones (a prompt crossing the cache's end names its first position past it, as
// the CPU kernel does).
__device__ __forceinline__ void gqa_check_position(int* flag, int node, int pos_mode,
                                                   const long long* pos_ids, int b, int B,
                                                   int S, int s, long long row,
                                                   int cache_rows) {
  const long long p = rope_position(pos_mode, pos_ids, b, S, s, row);
  if (p >= 0 && p < cache_rows) return;
  if (s > 0) {
    const long long q = rope_position(pos_mode, pos_ids, b, S, s - 1, row - 1);
    if (q < 0 || q >= cache_rows) return;
  }
  const int from = pos_mode == 0 ? ONNXEP_FROM_TOKEN
                   : pos_mode == 1 ? ONNXEP_FROM_FIRST_ID : ONNXEP_FROM_IDS;
  const long long where = pos_mode == 1 ? s : (long long)b * S + s;
  onnxep_fault(flag, node, ONNXEP_FAULT_POSITION, from, p, where, cache_rows, (long long)B * S, S);
}

// Rotary on Q and K, Q into qbuf (B, nh, S, D), the new K/V rows s < Q into the
// caches (B, nkv, C, D) at rows P + s. Sources are token rows of q_row/k_row/v_row
// elements; k_off/v_off locate K and V inside a packed QKV row. Positions: rope_position.
// The element (s, head 0, channel 0) of each batch row checks its token's lengths and
// position (flag: the provider's error record, or null).
template <typename T>
__global__ void __launch_bounds__(256) gqa_prepare(
    const T* __restrict__ qsrc, const T* __restrict__ ksrc, const T* __restrict__ vsrc,
    T* __restrict__ qbuf, T* __restrict__ kc, T* __restrict__ vc,
    const int* __restrict__ seqlens_k, const int* __restrict__ q_seqlens,
    const T* __restrict__ cosc, const T* __restrict__ sinc,
    const long long* __restrict__ pos_ids, int* flag, const GqaPrepare* __restrict__ prm) {
  const long long n = prm->n, k_off = prm->k_off, v_off = prm->v_off;
  const long long q_row = prm->q_row, k_row = prm->k_row, v_row = prm->v_row;
  const int B = prm->B, S = prm->S, nh = prm->nh, nkv = prm->nkv, D = prm->D, C = prm->C;
  const int kv_limit = prm->kv_limit, node = prm->node;
  const int rot = prm->rot, interleaved = prm->interleaved, pos_mode = prm->pos_mode;
  const int cache_rows = prm->cache_rows;
  const int H3 = nh + 2 * nkv;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
       idx += stride) {
    const int d = (int)(idx % D);
    const long long t = idx / D;
    const int hh = (int)(t % H3);
    const long long tok = t / H3;
    const int s = (int)(tok % S);
    const int b = (int)(tok / S);
    int Tb, Qb, Pb;
    batch_lengths(seqlens_k, q_seqlens, b, S, Tb, Qb, Pb);
    const long long row = (long long)Pb + s;
    if (hh == 0 && d == 0) {
      if (s == 0) gqa_check_lengths(flag, node, seqlens_k, q_seqlens, b, B, S, kv_limit, C);
      if (rot > 0 && s < Qb)
        gqa_check_position(flag, node, pos_mode, pos_ids, b, B, S, s, row, cache_rows);
    }
    const bool store_kv = s < Qb && row >= 0 && row < C;
    if (hh >= nh + nkv) {
      const int vh = hh - nh - nkv;
      if (store_kv)
        vc[(((long long)b * nkv + vh) * C + row) * D + d] =
            vsrc[v_off + tok * v_row + (long long)vh * D + d];
      continue;
    }
    const bool is_q = hh < nh;
    if (!is_q && !store_kv) continue;
    const T* head = is_q ? qsrc + tok * q_row + (long long)hh * D
                         : ksrc + k_off + tok * k_row + (long long)(hh - nh) * D;
    const long long p = rope_row(rope_position(pos_mode, pos_ids, b, S, s, row), cache_rows);
    const T out = rotated<T>(head, d, rot, interleaved, cosc, sinc, p);
    if (is_q) {
      qbuf[(((long long)b * nh + hh) * S + s) * D + d] = out;
    } else {
      kc[(((long long)b * nkv + (hh - nh)) * C + row) * D + d] = out;
    }
  }
}

// gqa_prepare 16 bytes at a time: a thread per V = 16 / sizeof(T) channels of a head row,
// with 32-bit index math (gqa_prepare's per-element 64-bit divisions and 2-byte accesses
// held it to a tenth of the bandwidth: 1.1 ms of a 2000-token 1.5B prefill on the H100).
// Where rotary pairs channel i with i + rot/2, the thread of the first half's chunk rotates
// both chunks; interleaved pairs lie inside a chunk. The same arithmetic as gqa_prepare
// (rope_channel's products, each rounded), so the same bits. The host runs it only where
// head rows, offsets, row strides and the rotary split are whole chunks, every array is
// 16-byte aligned and n / V fits 31 bits (else gqa_prepare).
template <typename T>
__global__ void __launch_bounds__(256) gqa_prepare_v(
    const T* __restrict__ qsrc, const T* __restrict__ ksrc, const T* __restrict__ vsrc,
    T* __restrict__ qbuf, T* __restrict__ kc, T* __restrict__ vc,
    const int* __restrict__ seqlens_k, const int* __restrict__ q_seqlens,
    const T* __restrict__ cosc, const T* __restrict__ sinc,
    const long long* __restrict__ pos_ids, int* flag, const GqaPrepare* __restrict__ prm) {
  constexpr int V = 16 / sizeof(T);
  const long long k_off = prm->k_off, v_off = prm->v_off;
  const long long q_row = prm->q_row, k_row = prm->k_row, v_row = prm->v_row;
  const int B = prm->B, S = prm->S, nh = prm->nh, nkv = prm->nkv, D = prm->D, C = prm->C;
  const int kv_limit = prm->kv_limit, node = prm->node;
  const int rot = prm->rot, interleaved = prm->interleaved, pos_mode = prm->pos_mode;
  const int cache_rows = prm->cache_rows;
  const int H3 = nh + 2 * nkv, U = D / V, half = rot >> 1;
  const unsigned n = (unsigned)(prm->n / V);
  const unsigned stride = gridDim.x * blockDim.x;
  for (unsigned idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += stride) {
    const unsigned t = idx / U;
    const int d0 = (int)(idx - t * U) * V;
    const unsigned tok = t / H3;
    const int hh = (int)(t - tok * H3);
    const int b = (int)(tok / S);
    const int s = (int)(tok - (unsigned)b * S);
    int Tb, Qb, Pb;
    batch_lengths(seqlens_k, q_seqlens, b, S, Tb, Qb, Pb);
    const long long row = (long long)Pb + s;
    if (hh == 0 && d0 == 0) {
      if (s == 0) gqa_check_lengths(flag, node, seqlens_k, q_seqlens, b, B, S, kv_limit, C);
      if (rot > 0 && s < Qb)
        gqa_check_position(flag, node, pos_mode, pos_ids, b, B, S, s, row, cache_rows);
    }
    const bool store_kv = s < Qb && row >= 0 && row < C;
    if (hh >= nh + nkv) {
      const int vh = hh - nh - nkv;
      if (store_kv)
        *reinterpret_cast<uint4*>(vc + (((long long)b * nkv + vh) * C + row) * D + d0) =
            *reinterpret_cast<const uint4*>(vsrc + v_off + tok * v_row + (long long)vh * D + d0);
      continue;
    }
    const bool is_q = hh < nh;
    if (!is_q && !store_kv) continue;
    const T* head = is_q ? qsrc + tok * q_row + (long long)hh * D
                         : ksrc + k_off + tok * k_row + (long long)(hh - nh) * D;
    T* dst = is_q ? qbuf + (((long long)b * nh + hh) * S + s) * D
                  : kc + (((long long)b * nkv + (hh - nh)) * C + row) * D;
    if (d0 >= rot) {
      *reinterpret_cast<uint4*>(dst + d0) = *reinterpret_cast<const uint4*>(head + d0);
      continue;
    }
    if (!interleaved && d0 >= half) continue;  // rotated by the first half's thread
    const long long p = rope_row(rope_position(pos_mode, pos_ids, b, S, s, row), cache_rows);
    const T* cr = cosc + p * half;
    const T* sr = sinc + p * half;
    const uint4 aw = *reinterpret_cast<const uint4*>(head + d0);
    if (interleaved) {
      *reinterpret_cast<uint4*>(dst + d0) = rope_chunk<T>(aw, aw, cr, sr, d0, half, 1);
      continue;
    }
    const uint4 bw = *reinterpret_cast<const uint4*>(head + d0 + half);
    *reinterpret_cast<uint4*>(dst + d0) = rope_chunk<T>(aw, bw, cr, sr, d0, half, 0);
    *reinterpret_cast<uint4*>(dst + d0 + half) = rope_chunk<T>(bw, aw, cr, sr, d0 + half, half, 0);
  }
}

// A fresh cache of C rows per (batch, KV head): the past's PL rows, then zeros.
template <typename T>
__global__ void __launch_bounds__(256) gqa_kv_fill(
    const T* __restrict__ pk, const T* __restrict__ pv, T* __restrict__ kc,
    T* __restrict__ vc, const GqaFill* __restrict__ prm) {
  const long long n = prm->n;
  const int C = prm->C, PL = prm->PL, D = prm->D;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
       idx += stride) {
    const int d = (int)(idx % D);
    const int t = (int)((idx / D) % C);
    const long long bh = idx / ((long long)C * D);
    if (t < PL) {
      const long long src = (bh * PL + t) * D + d;
      kc[idx] = pk[src];
      vc[idx] = pv[src];
    } else {
      kc[idx] = from_f<T>(0.f);
      vc[idx] = from_f<T>(0.f);
    }
  }
}

// One 16-byte load of K/V elements.
template <typename T>
struct alignas(16) Pack16 {
  T v[16 / sizeof(T)];
};

// Keys per split for a batch row attending kv_end keys: spread over the grid's nsplit
// blocks in whole tiles. Read on the device, so a fixed-capacity cache (whose
// total_sequence_length is the capacity) splits by the keys a step really attends.
__device__ __forceinline__ int split_chunk(int kv_end, int nsplit, int ktile) {
  const int per = (kv_end + nsplit - 1) / nsplit;
  return imax(ktile, (per + ktile - 1) / ktile * ktile);
}

// Single-token decode, rotary and the cache write fused in. Block (split c, KV head
// hk x row group rg, batch b), one warp per query head of the group (warp w: head
// hk*G + rg*rows + w). The block reads K/V rows [c*chunk, (c+1)*chunk) once for all its
// heads, a tile of `ktile` keys at a time, through 16-byte loads into shared memory;
// lane j of each warp scores key j of the tile, online softmax and the float32
// accumulator (lane owns channels lane + 32i) stay in registers.
// The new token's K/V row (position P = T - Q) is written by every block of the split
// holding it, before that block reads it (identical values), so no other launch is needed.
// A row needing one split (nsb == 1) is written to y at once; otherwise each split's
// partials go to part (m, then l, each [B*nh][nsplit], then acc [B*nh][nsplit][D]) and
// the last split to finish, counted in done[b, KV head, row group] (zero between
// steps), merges them.
template <typename T>
__global__ void __launch_bounds__(256) gqa_decode(
    const T* __restrict__ qsrc, const T* __restrict__ ksrc, const T* __restrict__ vsrc,
    T* kc, T* vc, const int* __restrict__ seqlens_k, const int* __restrict__ q_seqlens,
    const T* __restrict__ cosc, const T* __restrict__ sinc,
    const long long* __restrict__ pos_ids, const T* __restrict__ bias,
    const T* __restrict__ sink, float* part, int* __restrict__ done, T* __restrict__ y,
    int* flag, const GqaDecode* __restrict__ prm) {
  extern __shared__ float smem[];
  const long long k_off = prm->k_off, v_off = prm->v_off;
  const long long q_row = prm->q_row, k_row = prm->k_row, v_row = prm->v_row;
  const long long bsb = prm->bsb, bsh = prm->bsh, bsj = prm->bsj;
  const int B = prm->B, nh = prm->nh, nkv = prm->nkv, D = prm->D, C = prm->C;
  const int kv_limit = prm->kv_limit, nsplit = prm->nsplit;
  const int rows = prm->rows, nrg = prm->nrg, ktile = prm->ktile;
  const int rot = prm->rot, interleaved = prm->interleaved, pos_mode = prm->pos_mode;
  const int cache_rows = prm->cache_rows, smooth = prm->smooth;
  const int window = prm->window, causal = prm->causal, node = prm->node;
  const float scale = prm->scale, softcap = prm->softcap;
  const int G = nh / nkv;
  const int b = blockIdx.z;
  const int hk = blockIdx.y / nrg;
  const int rg = blockIdx.y - hk * nrg;
  const int c = blockIdx.x;
  const int Dp = D + 1;
  float* qs = smem;               // rows x D
  float* ks = qs + rows * D;      // ktile x (D + 1): lane j reads row j, no bank conflicts
  float* vs = ks + ktile * Dp;    // ktile x D
  float* ps = vs + ktile * D;     // rows x ktile

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
  const int chunk = split_chunk(kv_end, nsplit, ktile);
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
  const int j0 = c * chunk;
  const int jn = imax(0, imin(chunk, kv_end - j0));

  for (int idx = threadIdx.x; idx < rows * D; idx += blockDim.x) {
    const int r = idx / D, d = idx - r * D;
    const int g = rg * rows + r;
    const T* qh = qsrc + (long long)b * q_row + (long long)(hk * G + g) * D;
    qs[idx] = g < G ? to_f(rotated<T>(qh, d, rot, interleaved, cosc, sinc, p)) : 0.f;
  }
  constexpr int VN = 16 / sizeof(T);
  const bool vec = D % VN == 0 && (((unsigned long long)kc | (unsigned long long)vc) & 15) == 0;
  const int step = vec ? VN : 1, nv = D / step;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = rg * rows + warp;
  const bool live = g < G;
  const int h = hk * G + (live ? g : 0);
  const float* q = qs + warp * D;
  float* pw = ps + warp * ktile;
  float m = ONNXEP_NEG_INF, l = 0.f;
  float acc[GQA_LANE_CHANNELS];
  for (int i = 0; i < GQA_LANE_CHANNELS; ++i) acc[i] = 0.f;
  for (int t0 = 0; t0 < jn; t0 += ktile) {
    const int tn = imin(ktile, jn - t0);
    __syncthreads();  // the query and the new row are written; the previous tile is consumed
    for (int idx = threadIdx.x; idx < tn * nv; idx += blockDim.x) {
      const int jj = idx / nv, d0 = (idx - jj * nv) * step;
      const long long gi = kv0 + (long long)(j0 + t0 + jj) * D + d0;
      float* kd = ks + jj * Dp + d0;
      float* vd = vs + jj * D + d0;
      if (vec) {
        const Pack16<T> kp = *reinterpret_cast<const Pack16<T>*>(kc + gi);
        const Pack16<T> vp = *reinterpret_cast<const Pack16<T>*>(vc + gi);
        for (int e = 0; e < VN; ++e) {
          kd[e] = to_f(kp.v[e]);
          vd[e] = to_f(vp.v[e]);
        }
      } else {
        kd[0] = to_f(kc[gi]);
        vd[0] = to_f(vc[gi]);
      }
    }
    __syncthreads();
    const int j = j0 + t0 + lane;
    float sv = ONNXEP_NEG_INF;
    if (live && lane < tn && (!causal || j <= row) && (window < 0 || row - j < window)) {
      const float* k = ks + lane * Dp;
      float dot = 0.f;
      for (int d = 0; d < D; ++d) dot = fmaf(q[d], k[d], dot);
      sv = attn_score<T>(dot, scale, softcap, bias, b * bsb + (long long)h * bsh + j * bsj);
    }
    const float mn = fmaxf(m, warp_max(sv));
    const float pj = mn == ONNXEP_NEG_INF ? 0.f : expf(sv - mn);
    const float alpha = m == ONNXEP_NEG_INF ? 0.f : expf(m - mn);
    l = l * alpha + warp_sum(pj);
    m = mn;
    if (lane < ktile) pw[lane] = pj;
    __syncthreads();  // pw is read by every lane of the warp
    for (int i = 0; i < GQA_LANE_CHANNELS; ++i) {
      const int d = lane + 32 * i;
      if (d >= D) break;
      float a = acc[i] * alpha;
      for (int jj = 0; jj < tn; ++jj) a = fmaf(pw[jj], vs[jj * D + d], a);
      acc[i] = a;
    }
  }
  const long long orow = (long long)b * nh + h;
  const bool has_sink = sink != nullptr || smooth != 0;
  const float sk = sink != nullptr ? to_f(sink[h]) : 0.f;
  if (nsb == 1) {
    for (int i = 0; i < GQA_LANE_CHANNELS && live; ++i) {
      const int d = lane + 32 * i;
      if (d >= D) break;
      y[orow * D + d] = from_f<T>(attn_finish(acc[i], m, l, has_sink, sk));
    }
    return;
  }
  const long long nout = (long long)B * nh;
  float* pm = part + orow * nsplit;
  float* pl = part + nout * nsplit + orow * nsplit;
  float* pa = part + 2 * nout * nsplit + orow * nsplit * D;
  if (live) {
    for (int i = 0; i < GQA_LANE_CHANNELS; ++i) {
      const int d = lane + 32 * i;
      if (d >= D) break;
      pa[(long long)c * D + d] = acc[i];
    }
    if (lane == 0) {
      pm[c] = m;
      pl[c] = l;
    }
  }
  // The last of the row's nsb splits to finish merges them all (no reduce launch): the
  // partials are made visible device-wide before the ticket is taken.
  __threadfence();
  __syncthreads();  // every warp is past the tile loop: ps[0] is free
  const int col = b * gridDim.y + blockIdx.y;
  if (threadIdx.x == 0) {
    const int ticket = atomicAdd(done + col, 1);
    ps[0] = ticket == nsb - 1 ? 1.f : 0.f;
    if (ticket == nsb - 1) done[col] = 0;  // ready for the next step (graph replays)
  }
  __syncthreads();
  if (ps[0] == 0.f || !live) return;
  // Partials written by other blocks are read through L2 (__ldcg), not a stale L1 line.
  // Lane k holds split k's weight (32 splits at a time) and hands it round by shuffles, so
  // the loads of the partial outputs depend on nothing and overlap instead of waiting one
  // after the other.
  float mx = ONNXEP_NEG_INF;
  for (int k = lane; k < nsb; k += 32) mx = fmaxf(mx, __ldcg(pm + k));
  mx = warp_max(mx);
  const float mf = has_sink ? fmaxf(mx, sk) : mx;
  float lt = 0.f;
  for (int i = 0; i < GQA_LANE_CHANNELS; ++i) acc[i] = 0.f;
  for (int k0 = 0; k0 < nsb; k0 += 32) {
    const int k = k0 + lane;
    float wk = 0.f;
    if (k < nsb) {
      const float mk = __ldcg(pm + k);
      wk = mk == ONNXEP_NEG_INF ? 0.f : expf(mk - mf);
      lt = fmaf(wk, __ldcg(pl + k), lt);
    }
    const int kn = imin(32, nsb - k0);
    for (int kk = 0; kk < kn; ++kk) {
      const float w = __shfl_sync(0xffffffffu, wk, kk);
      const float* pk = pa + (long long)(k0 + kk) * D;
      for (int i = 0; i < GQA_LANE_CHANNELS; ++i) {
        const int d = lane + 32 * i;
        if (d >= D) break;
        acc[i] = fmaf(w, __ldcg(pk + d), acc[i]);
      }
    }
  }
  lt = warp_sum(lt);
  if (has_sink && mf != ONNXEP_NEG_INF) lt += expf(sk - mf);
  for (int i = 0; i < GQA_LANE_CHANNELS; ++i) {
    const int d = lane + 32 * i;
    if (d >= D) break;
    y[orow * D + d] = from_f<T>(mf != ONNXEP_NEG_INF && lt > 0.f ? acc[i] / lt : 0.f);
  }
}

// Tiled prefill: block (query tile of BQ rows from s0, query head h, batch b); key
// tiles of BK rows staged in shared memory (K padded to D + 1 columns against bank
// conflicts); online softmax with float32 running max, sum and output.
template <typename T>
__global__ void __launch_bounds__(128) gqa_prefill(
    const T* __restrict__ qbuf, const T* __restrict__ kc, const T* __restrict__ vc,
    const int* __restrict__ seqlens_k, const int* __restrict__ q_seqlens,
    const T* __restrict__ bias, const T* __restrict__ sink, T* __restrict__ y,
    const GqaAttn* __restrict__ prm) {
  extern __shared__ float smem[];
  const long long bsb = prm->bsb, bsh = prm->bsh, bss = prm->bss, bsj = prm->bsj;
  const int S = prm->S, nh = prm->nh, nkv = prm->nkv, D = prm->D, C = prm->C;
  const int kv_limit = prm->kv_limit, BQ = prm->BQ, BK = prm->BK, smooth = prm->smooth;
  const int window = prm->window, causal = prm->causal;
  const float scale = prm->scale, softcap = prm->softcap;
  const int b = blockIdx.z, h = blockIdx.y, s0 = blockIdx.x * BQ;
  const int hk = h / (nh / nkv);
  const int Dp = D + 1;
  float* Qs = smem;           // BQ x D
  float* Ks = Qs + BQ * D;    // BK x (D + 1)
  float* Vs = Ks + BK * Dp;   // BK x D
  float* Ps = Vs + BK * D;    // BQ x BK
  float* Os = Ps + BQ * BK;   // BQ x D
  float* Ms = Os + BQ * D;    // BQ
  float* Ls = Ms + BQ;        // BQ
  float* As = Ls + BQ;        // BQ

  int Tb, Qb, Pb;
  batch_lengths(seqlens_k, q_seqlens, b, S, Tb, Qb, Pb);
  const int kv_end = imax(0, imin(imin(Tb, kv_limit), C));
  const int rows = imin(BQ, S - s0);
  int j_hi = kv_end;
  if (causal) j_hi = imin(j_hi, Pb + s0 + rows);  // keys j <= P + s of the last row
  const int j_lo = window >= 0 ? imax(0, Pb + s0 - window + 1) : 0;
  const long long kv0 = ((long long)b * nkv + hk) * C * D;

  for (int idx = threadIdx.x; idx < BQ * D; idx += blockDim.x) {
    const int r = idx / D, d = idx - r * D;
    Qs[idx] = r < rows ? to_f(qbuf[(((long long)b * nh + h) * S + s0 + r) * D + d]) : 0.f;
    Os[idx] = 0.f;
  }
  for (int r = threadIdx.x; r < BQ; r += blockDim.x) {
    Ms[r] = ONNXEP_NEG_INF;
    Ls[r] = 0.f;
  }
  for (int jt = j_lo; jt < j_hi; jt += BK) {
    const int kn = imin(BK, j_hi - jt);
    __syncthreads();  // Q/O initialised; the previous tile is consumed
    for (int idx = threadIdx.x; idx < BK * D; idx += blockDim.x) {
      const int jj = idx / D, d = idx - jj * D;
      float kv = 0.f, vv = 0.f;
      if (jj < kn) {
        const long long gi = kv0 + (long long)(jt + jj) * D + d;
        kv = to_f(kc[gi]);
        vv = to_f(vc[gi]);
      }
      Ks[jj * Dp + d] = kv;
      Vs[idx] = vv;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < BQ * BK; idx += blockDim.x) {
      const int r = idx / BK, jj = idx - r * BK;
      const int s = s0 + r, j = jt + jj;
      float v = ONNXEP_NEG_INF;
      if (r < rows && jj < kn) {
        const int pos = Pb + s;
        if ((!causal || j <= pos) && (window < 0 || pos - j < window)) {
          const float* q = Qs + r * D;
          const float* k = Ks + jj * Dp;
          float dot = 0.f;
          for (int d = 0; d < D; ++d) dot = fmaf(q[d], k[d], dot);
          const long long bi = b * bsb + (long long)h * bsh + s * bss + j * bsj;
          v = attn_score<T>(dot, scale, softcap, bias, bi);
        }
      }
      Ps[idx] = v;
    }
    __syncthreads();
    softmax_tile(Ps, Ms, Ls, As, BQ, BK);
    __syncthreads();
    accumulate_tile(Os, Ps, Vs, As, BQ, BK, D, kn);
  }
  __syncthreads();
  const bool has_sink = sink != nullptr || smooth != 0;
  const float sv = sink != nullptr ? to_f(sink[h]) : 0.f;
  for (int idx = threadIdx.x; idx < rows * D; idx += blockDim.x) {
    const int r = idx / D, d = idx - r * D;
    const int s = s0 + r;
    y[(((long long)b * S + s) * nh + h) * D + d] =
        from_f<T>(attn_finish(Os[idx], Ms[r], Ls[r], has_sink, sv));
  }
}
"""
)

KERNEL_NAMES = ("gqa_prepare", "gqa_prepare_v", "gqa_kv_fill", "gqa_decode", "gqa_prefill")
NAME_EXPRESSIONS = instantiations(KERNEL_NAMES)
