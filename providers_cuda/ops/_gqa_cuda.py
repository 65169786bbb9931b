"""CUDA kernels of GroupQueryAttention (their launch geometry is in ``_gqa_geometry.py``).

Layouts: queries, keys and values arrive as (B, S, heads*D) rows (packed QKV
or three inputs); the KV cache is (B, Hkv, C, D) with C its capacity; the
output is (B, S, Hq*D). Per batch row ``b`` everything the CPU kernel derives
from ``seqlens_k`` is derived on the device: ``T = seqlens_k[b] + 1`` valid
keys, ``Q = min(T, S)`` (or ``query_seqlens[b]``) new rows, ``P = T - Q``
cached before them; query row ``s`` sits at position ``P + s``.

A step is ``gqa_prepare`` (rotary on Q and K, Q to a (B, Hq, S, D) buffer,
new K/V rows into the cache), then either

* ``gqa_decode`` (few query rows): split-K flash decoding. The cache length
  is cut into chunks across blocks, one block per (chunk, KV head, row
  group, batch) computing every query row of its KV head group with float32
  partial max/sum/accumulator; ``gqa_reduce`` merges the chunks. With one
  chunk the block writes the output itself.
* ``gqa_prefill``: one block per (query tile, query head, batch); K/V tiles
  staged in shared memory, online softmax, float32 accumulation.

``gqa_kv_fill`` builds a fresh cache (past rows, then zeros) when the present
cache is not the past buffer itself.
"""

from __future__ import annotations

from ._attention_cuda import COMMON_SOURCE, instantiations, params

PREPARE = params(
    "GqaPrepare",
    i64="n k_off v_off q_row k_row v_row",
    i32="S nh nkv D C rot interleaved pos_mode cache_rows",
)
FILL = params("GqaFill", i64="n", i32="C PL D")
ATTN = params(
    "GqaAttn",
    i64="bsb bsh bss bsj",
    i32="B S nh nkv D C kv_limit chunk nchunks rows nrg ktile BQ BK smooth window causal",
    f32="scale softcap",
)

GQA_SOURCE = (
    COMMON_SOURCE
    + PREPARE.source
    + FILL.source
    + ATTN.source
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

// Rotary on Q and K, Q into qbuf (B, nh, S, D), the new K/V rows s < Q into the
// caches (B, nkv, C, D) at rows P + s. Sources are token rows of q_row/k_row/v_row
// elements; k_off/v_off locate K and V inside a packed QKV row.
// pos_mode 0: position P + s, clamped into the cos/sin cache as the CPU kernel does;
// 1: pos_ids[0] + s; 2: pos_ids[b, s] -- an id outside the cache gives NaN channels.
template <typename T>
__global__ void __launch_bounds__(256) gqa_prepare(
    const T* __restrict__ qsrc, const T* __restrict__ ksrc, const T* __restrict__ vsrc,
    T* __restrict__ qbuf, T* __restrict__ kc, T* __restrict__ vc,
    const int* __restrict__ seqlens_k, const int* __restrict__ q_seqlens,
    const T* __restrict__ cosc, const T* __restrict__ sinc,
    const long long* __restrict__ pos_ids, const GqaPrepare* __restrict__ prm) {
  const long long n = prm->n, k_off = prm->k_off, v_off = prm->v_off;
  const long long q_row = prm->q_row, k_row = prm->k_row, v_row = prm->v_row;
  const int S = prm->S, nh = prm->nh, nkv = prm->nkv, D = prm->D, C = prm->C;
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
    T out;
    if (d < rot) {
      long long p;
      if (pos_mode == 0) {
        p = row;
      } else if (pos_mode == 1) {
        p = pos_ids[0] + s;
      } else {
        p = pos_ids[(long long)b * S + s];
      }
      if (pos_mode == 0) {
        p = lclamp(p, 0, (long long)cache_rows - 1);
      }
      if (p < 0 || p >= cache_rows) {
        out = from_f<T>(ONNXEP_NAN);
      } else {
        const long long off = p * (rot >> 1);
        out = from_f<T>(rope_channel<T>(head, d, rot, interleaved, cosc + off, sinc + off, 1.0f));
      }
    } else {
      out = head[d];
    }
    if (is_q) {
      qbuf[(((long long)b * nh + hh) * S + s) * D + d] = out;
    } else {
      kc[(((long long)b * nkv + (hh - nh)) * C + row) * D + d] = out;
    }
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

// Split-K decode. Block (chunk c, KV head hk x row group rg, batch b) scores keys
// [c*chunk, (c+1)*chunk) against `rows` query rows of KV head hk (row rr = g*S + s:
// query head hk*G + g, token s). Keys are limited to min(T, kv_limit).
// part (nchunks > 1): m, then l, each [B*nh*S][nchunks], then acc [B*nh*S][nchunks][D].
template <typename T>
__global__ void __launch_bounds__(128) gqa_decode(
    const T* __restrict__ qbuf, const T* __restrict__ kc, const T* __restrict__ vc,
    const int* __restrict__ seqlens_k, const int* __restrict__ q_seqlens,
    const T* __restrict__ bias, const T* __restrict__ sink, float* __restrict__ part,
    T* __restrict__ y, const GqaAttn* __restrict__ prm) {
  extern __shared__ float smem[];
  const long long bsb = prm->bsb, bsh = prm->bsh, bss = prm->bss, bsj = prm->bsj;
  const int B = prm->B, S = prm->S, nh = prm->nh, nkv = prm->nkv, D = prm->D, C = prm->C;
  const int kv_limit = prm->kv_limit, chunk = prm->chunk, nchunks = prm->nchunks;
  const int rows = prm->rows, nrg = prm->nrg, ktile = prm->ktile, smooth = prm->smooth;
  const int window = prm->window, causal = prm->causal;
  const float scale = prm->scale, softcap = prm->softcap;
  const int G = nh / nkv;
  const int b = blockIdx.z;
  const int hk = blockIdx.y / nrg;
  const int rg = blockIdx.y - hk * nrg;
  const int c = blockIdx.x;
  const int Dp = D + 1;
  float* qs = smem;               // rows x D
  float* sc = qs + rows * D;      // rows x chunk
  float* ks = sc + rows * chunk;  // ktile x (D + 1)
  float* ms = ks + ktile * Dp;    // rows
  float* ls = ms + rows;          // rows

  int Tb, Qb, Pb;
  batch_lengths(seqlens_k, q_seqlens, b, S, Tb, Qb, Pb);
  const int kv_end = imax(0, imin(imin(Tb, kv_limit), C));
  const int j0 = c * chunk;
  if (nchunks > 1 && j0 >= kv_end) return;  // gqa_reduce skips these chunks too
  const int jn = imax(0, imin(chunk, kv_end - j0));
  const int nrows = G * S;
  const long long kv0 = (((long long)b * nkv + hk) * C + j0) * D;

  for (int idx = threadIdx.x; idx < rows * D; idx += blockDim.x) {
    const int r = idx / D, d = idx - r * D;
    const int rr = rg * rows + r;
    float v = 0.f;
    if (rr < nrows) {
      const int g = rr / S, s = rr - g * S;
      v = to_f(qbuf[(((long long)b * nh + hk * G + g) * S + s) * D + d]);
    }
    qs[idx] = v;
  }
  for (int t0 = 0; t0 < jn; t0 += ktile) {
    const int tn = imin(ktile, jn - t0);
    __syncthreads();  // qs written; the previous tile's scores are done with ks
    for (int idx = threadIdx.x; idx < tn * D; idx += blockDim.x) {
      const int jj = idx / D, d = idx - jj * D;
      ks[jj * Dp + d] = to_f(kc[kv0 + (long long)(t0 + jj) * D + d]);
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < rows * tn; idx += blockDim.x) {
      const int r = idx / tn, jj = idx - r * tn;
      const int rr = rg * rows + r;
      const int j = j0 + t0 + jj;
      float v = ONNXEP_NEG_INF;
      if (rr < nrows) {
        const int g = rr / S, s = rr - g * S;
        const int pos = Pb + s;
        if ((!causal || j <= pos) && (window < 0 || pos - j < window)) {
          const float* q = qs + r * D;
          const float* k = ks + jj * Dp;
          float dot = 0.f;
          for (int d = 0; d < D; ++d) dot = fmaf(q[d], k[d], dot);
          const long long bi = b * bsb + (long long)(hk * G + g) * bsh + s * bss + j * bsj;
          v = attn_score<T>(dot, scale, softcap, bias, bi);
        }
      }
      sc[r * chunk + t0 + jj] = v;
    }
  }
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  for (int r = warp; r < rows; r += nw) {
    float* pr = sc + r * chunk;
    float m = ONNXEP_NEG_INF;
    for (int jj = lane; jj < jn; jj += 32) m = fmaxf(m, pr[jj]);
    m = warp_max(m);
    float l = 0.f;
    for (int jj = lane; jj < jn; jj += 32) {
      const float p = m == ONNXEP_NEG_INF ? 0.f : expf(pr[jj] - m);
      pr[jj] = p;
      l += p;
    }
    l = warp_sum(l);
    if (lane == 0) {
      ms[r] = m;
      ls[r] = l;
    }
  }
  __syncthreads();

  // P V, one V tile at a time through ks; qs, free now, accumulates (same idx per thread).
  for (int idx = threadIdx.x; idx < rows * D; idx += blockDim.x) qs[idx] = 0.f;
  for (int t0 = 0; t0 < jn; t0 += ktile) {
    const int tn = imin(ktile, jn - t0);
    __syncthreads();  // the previous tile is consumed
    for (int idx = threadIdx.x; idx < tn * D; idx += blockDim.x) {
      const int jj = idx / D, d = idx - jj * D;
      ks[jj * Dp + d] = to_f(vc[kv0 + (long long)(t0 + jj) * D + d]);
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < rows * D; idx += blockDim.x) {
      const int r = idx / D, d = idx - r * D;
      if (ms[r] == ONNXEP_NEG_INF) continue;
      const float* pr = sc + r * chunk + t0;
      float a = qs[idx];
      for (int jj = 0; jj < tn; ++jj) a = fmaf(pr[jj], ks[jj * Dp + d], a);
      qs[idx] = a;
    }
  }

  const bool has_sink = sink != nullptr || smooth != 0;
  const long long nout = (long long)B * nh * S;
  for (int idx = threadIdx.x; idx < rows * D; idx += blockDim.x) {
    const int r = idx / D, d = idx - r * D;
    const int rr = rg * rows + r;
    if (rr >= nrows) continue;
    const int g = rr / S, s = rr - g * S, h = hk * G + g;
    const float m = ms[r];
    const float a = qs[idx];
    const long long orow = ((long long)b * nh + h) * S + s;
    if (nchunks == 1) {
      const float sv = sink != nullptr ? to_f(sink[h]) : 0.f;
      y[(((long long)b * S + s) * nh + h) * D + d] =
          from_f<T>(attn_finish(a, m, ls[r], has_sink, sv));
    } else {
      part[2 * nout * nchunks + (orow * nchunks + c) * D + d] = a;
      if (d == 0) {
        part[orow * nchunks + c] = m;
        part[nout * nchunks + orow * nchunks + c] = ls[r];
      }
    }
  }
}

// Merges the decode chunks of one output row (b, h, s): block x = (b * nh + h) * S + s.
template <typename T>
__global__ void __launch_bounds__(256) gqa_reduce(
    const float* __restrict__ part, T* __restrict__ y, const int* __restrict__ seqlens_k,
    const T* __restrict__ sink, const GqaAttn* __restrict__ prm) {
  const int B = prm->B, S = prm->S, nh = prm->nh, D = prm->D, kv_limit = prm->kv_limit;
  const int chunk = prm->chunk, nchunks = prm->nchunks, smooth = prm->smooth;
  const long long orow = blockIdx.x;
  const int s = (int)(orow % S);
  const int h = (int)((orow / S) % nh);
  const int b = (int)(orow / ((long long)S * nh));
  const int kv_end = imax(0, imin(seqlens_k[b] + 1, kv_limit));  // kv_limit <= C
  const int nc = imin(nchunks, (kv_end + chunk - 1) / chunk);
  const long long nout = (long long)B * nh * S;
  const float* pm = part + orow * nchunks;
  const float* pl = part + nout * nchunks + orow * nchunks;
  const float* pa = part + 2 * nout * nchunks + orow * nchunks * D;
  const bool has_sink = sink != nullptr || smooth != 0;
  const float sv = sink != nullptr ? to_f(sink[h]) : 0.f;
  float mx = ONNXEP_NEG_INF;
  for (int c = 0; c < nc; ++c) mx = fmaxf(mx, pm[c]);
  const float mf = has_sink ? fmaxf(mx, sv) : mx;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float out = 0.f;
    if (mf != ONNXEP_NEG_INF) {
      float l = has_sink ? expf(sv - mf) : 0.f;
      float a = 0.f;
      for (int c = 0; c < nc; ++c) {
        const float mc = pm[c];
        if (mc == ONNXEP_NEG_INF) continue;
        const float w = expf(mc - mf);
        l += pl[c] * w;
        a += pa[(long long)c * D + d] * w;
      }
      out = l > 0.f ? a / l : 0.f;
    }
    y[(((long long)b * S + s) * nh + h) * D + d] = from_f<T>(out);
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
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
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
    for (int r = warp; r < BQ; r += nw) {
      float* pr = Ps + r * BK;
      float mt = ONNXEP_NEG_INF;
      for (int jj = lane; jj < BK; jj += 32) mt = fmaxf(mt, pr[jj]);
      mt = warp_max(mt);
      const float mo = Ms[r];
      const float mn = fmaxf(mo, mt);
      float sum = 0.f;
      for (int jj = lane; jj < BK; jj += 32) {
        const float p = mn == ONNXEP_NEG_INF ? 0.f : expf(pr[jj] - mn);
        pr[jj] = p;
        sum += p;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float a = mo == ONNXEP_NEG_INF ? 0.f : expf(mo - mn);
        As[r] = a;
        Ms[r] = mn;
        Ls[r] = Ls[r] * a + sum;
      }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < BQ * D; idx += blockDim.x) {
      const int r = idx / D, d = idx - r * D;
      const float* pr = Ps + r * BK;
      float o = Os[idx] * As[r];
      for (int jj = 0; jj < kn; ++jj) o = fmaf(pr[jj], Vs[jj * D + d], o);
      Os[idx] = o;
    }
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

KERNEL_NAMES = ("gqa_prepare", "gqa_kv_fill", "gqa_decode", "gqa_reduce", "gqa_prefill")
NAME_EXPRESSIONS = instantiations(KERNEL_NAMES)
