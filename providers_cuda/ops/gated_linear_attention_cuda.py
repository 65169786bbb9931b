"""The fused GatedLinearAttention kernel: LinearAttention with its gates and q/k L2 norms inside.

``linear_attention_cuda``'s recurrence (same blocks, lanes, tiles and token
stage), with three changes where a token is staged in shared memory:

- the decay is ``exp(round(decay_scale * softplus(a + dt_bias)))`` and beta
  ``round(sigmoid(b))``, rounded to a's type as ``LinearAttentionGate``
  stores them (``hybrid_cuda``'s ``la_gate``, same device functions), where
  LinearAttention reads the stored decay and beta;
- with ``qnorm`` / ``knorm`` each staged head of q / k (d_k values) is
  divided by its L2 norm, 0 where the norm is 0, and rounded to its type, a
  warp per head summing squares in ``lp_normalize``'s warp order (a lane
  takes elements lane, lane + 32, ..., then a xor-shuffle sum); q is then
  multiplied by ``qscale`` and rounded again (the export's ``Mul``; without
  the norm, as q is staged);
- everything else is LinearAttention's, so the CPU kernels' order holds.

Each block stages the heads it reads itself, so the norms are computed once
per block that reads a head (several blocks share a head when its state
columns are tiled): no extra launch and no extra pass over q and k in
global memory.
"""

from __future__ import annotations

from .linear_attention_cuda import LA_BODY

GLA_BODY = (
    LA_BODY
    + r"""
// Divide each of the n_vec staged vectors (d_k floats at stage + at(v)) by its L2 norm, a
// warp per vector; 0 where the norm is 0. Rounded to the operand's type, then scaled by mul
// and rounded again when mul != 1. Every lane of a warp takes part in each of its vectors.
__device__ __forceinline__ void gla_l2_normalize(float* stage, int F, int off, int stride,
                                                 int per_token, int n, int dk, int half,
                                                 float mul) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  for (int e = warp; e < n * per_token; e += warps) {
    float* x = stage + (e / per_token) * F + off + (e % per_token) * stride;
    float acc = 0.f;
    for (int i = lane; i < dk; i += 32) acc += __fmul_rn(x[i], x[i]);
    const float norm = sqrtf(warp_reduce<R_SUM>(acc));
    for (int i = lane; i < dk; i += 32) {
      float o = round_to(norm == 0.f ? 0.f : x[i] / norm, half);
      if (mul != 1.f) o = round_to(__fmul_rn(o, mul), half);
      x[i] = o;
    }
  }
}

// GatedLinearAttention: linear_attention's block layout, arguments and per-token recurrence
// (la_begin, la_tokens), with the decay and beta
// computed from a, dt_bias, decay_scale and b (decay (B, T, hkv * gw) is a (B, T, hkv * gw) with
// one dt_bias and decay_scale value per last-axis position; beta from b (B, T, bw)), and q / k
// L2-normalised per head when qnorm / knorm. The rule is gated (delta == 0) or gated_delta.
// types bits: 0 q, 1 k, 2 v, 3 past, 4 a (and the gates' stored type), 5 b, 6 y, 7 present,
// 8 dt_bias, 9 decay_scale.
__global__ void gated_linear_attention(const void* q, const void* k, const void* v,
                                       const void* past, const void* a, const void* dt_bias,
                                       const void* decay_scale, const void* b, void* y,
                                       void* present, i64 B, i64 T, int hq, int hkv, int nk,
                                       int dk, int dv, int G, int qdiv, int kdiv, int gw, int bw,
                                       int P, int CB, int TT, int window, i64 past_off,
                                       float scale, int delta, int qnorm, int knorm,
                                       float qscale, int types) {
  __shared__ float tile[LA_TILE];
  __shared__ float stage[LA_STAGE];
  const int tid = threadIdx.x, nt = blockDim.x;
  const int col = tid / P, p = tid % P;
  const int tiles = (dv + CB - 1) / CB;
  const int j0 = (int)(blockIdx.x % tiles) * CB;
  const i64 bh = (i64)blockIdx.x / tiles;
  const int h = (int)(bh % hkv);
  const i64 b_ = bh / hkv;
  const int j = j0 + col;
  const i64 head = bh * dk * dv;
  const i64 slot = B * hkv * dk * dv;
  const int ah = HALF(types, 4);

  float s[LA_ROWS];
  const int qhalf = HALF(types, 7);
  la_begin(s, tile, past, present, past_off, head, slot, T, window, dk, dv, j0, CB, col, p, P,
           HALF(types, 3), qhalf);

  const int fq = dk, fg = fq + G * dk, fb = fg + gw, fv = fb + (delta ? 1 : 0);
  const int F = fv + CB;
  const int kh = h / kdiv;
  for (i64 t0 = 0; t0 < T; t0 += TT) {
    const int n = (int)(T - t0 < TT ? T - t0 : TT);
    const i64 bt0 = b_ * T + t0;
    __syncthreads();
    for (int e = tid; e < n * dk; e += nt) {
      const int tt = e / dk, i = e % dk;
      stage[tt * F + i] = ld(k, ((bt0 + tt) * nk + kh) * dk + i, HALF(types, 1));
    }
    for (int e = tid; e < n * G * dk; e += nt) {
      const int tt = e / (G * dk), r = e % (G * dk);
      const int qh = (h * G + r / dk) / qdiv;
      float x = ld(q, ((bt0 + tt) * hq + qh) * dk + r % dk, HALF(types, 0));
      if (!qnorm && qscale != 1.f) x = round_to(__fmul_rn(x, qscale), HALF(types, 0));
      stage[tt * F + fq + r] = x;
    }
    for (int e = tid; e < n * gw; e += nt) {
      const int tt = e / gw, i = e % gw;
      const int c = h * gw + i;
      const float z = ld(a, ((bt0 + tt) * hkv + h) * gw + i, ah) + ld(dt_bias, c, HALF(types, 8));
      const float g = round_to(__fmul_rn(ld(decay_scale, c, HALF(types, 9)), softplus_f(z)), ah);
      stage[tt * F + fg + i] = expf(g);
    }
    if (delta) {
      for (int e = tid; e < n; e += nt) {
        const float bv = ld(b, (bt0 + e) * bw + (bw == 1 ? 0 : h), HALF(types, 5));
        stage[e * F + fb] = round_to(sigmoid_f(bv), ah);
      }
    }
    for (int e = tid; e < n * CB; e += nt) {
      const int tt = e / CB, c = e % CB;
      float val = 0.f;
      if (j0 + c < dv) val = ld(v, ((bt0 + tt) * hkv + h) * dv + j0 + c, HALF(types, 2));
      stage[tt * F + fv + c] = val;
    }
    if (qnorm || knorm) {
      __syncthreads();  // the staged heads are complete before a warp normalises one
      if (knorm) gla_l2_normalize(stage, F, 0, dk, 1, n, dk, HALF(types, 1), 1.f);
      if (qnorm) gla_l2_normalize(stage, F, fq, dk, G, n, dk, HALF(types, 0), qscale);
    }
    __syncthreads();
    la_tokens(s, tile, stage, F, fq, fg, fb, fv, n, t0, T, b_, h, hkv, G, gw, 1, delta, dk, dv,
              j0, j, CB, col, p, P, scale, y, HALF(types, 6), present, window, slot, head, qhalf);
  }
  if (window == 0) la_store_state(present, head, s, tile, dk, dv, j0, CB, col, p, P, qhalf);
}
"""
)

GLA_NAMES = ("gated_linear_attention",)
