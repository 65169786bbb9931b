"""CUDA kernels of ONNX Attention (opsets 23-25) and onnxep::Attention.

The attention kernel is GroupQueryAttention's tiled prefill (``gqa_cuda.py``:
one block per (query tile, query head, batch), K/V tiles staged in shared
memory, online softmax with float32 running max, sum and output) generalised
to what Attention-23 allows and GroupQueryAttention does not:

* Q, K, V and Y are read and written through (batch, head, row) element
  strides, so 3-D (B, S, H*D) and 4-D (B, H, S, D) layouts need no transpose;
* V's head size ``Dv`` may differ from Q and K's ``D``;
* the mask is a bool (read as bytes) or float16/float32 additive mask read
  through broadcast strides over (B, Hq, Sq, cols); keys at or past its
  ``cols`` columns are masked out, as the CPU kernel pads it with -inf;
* the causal frontier is bottom-right aligned: query row ``s`` sits at
  position ``offset + s`` with ``offset`` the past length, or
  ``nonpad_kv_seqlen[b] - Sq`` for an external cache (read on the device);
  keys at or past ``nonpad_kv_seqlen[b]`` are masked out;
* opset 25's windows: key ``j`` needs ``pos - j <= left`` and ``j - pos <= right``.

A row with no attendable key gives zeros, as the CPU kernel does. When the
query tiles alone leave the device idle (decode: a few query rows over a
long cache) the keys are also split across blocks (``nsplit``), each writing
a partial max, sum and output that ``att_reduce`` merges, as GroupQueryAttention's
split-K decode does.
``att_concat`` writes present_key/present_value (past rows, then the new
rows through their strides) so the attention reads one contiguous cache.
"""

from __future__ import annotations

from .attention_cuda import COMMON_SOURCE, instantiations, params

CONCAT = params("AttConcat", i64="n sb sh ss", i32="H P L D")
ATTN = params(
    "AttParams",
    i64="qsb qsh qss ksb ksh kss vsb vsh vss ysb ysh yss msb msh mss past",
    i32="Sq Sk nh nkv D Dv BQ BK causal left right mask_cols nonpad_offset nsplit chunk",
    f32="scale softcap",
)

ATTENTION_SOURCE = (
    COMMON_SOURCE
    + CONCAT.source
    + ATTN.source
    + r"""
// present = concat(past, new) along the sequence: (B, H, P + L_new, D) contiguous, where
// L = P + L_new. The new rows are read through element strides (sb, sh, ss), so a 3-D
// (B, S, H*D) key lands in the cache without a transpose first.
template <typename T>
__global__ void __launch_bounds__(256) att_concat(
    const T* __restrict__ past, const T* __restrict__ src, T* __restrict__ dst,
    const AttConcat* __restrict__ prm) {
  const long long n = prm->n, sb = prm->sb, sh = prm->sh, ss = prm->ss;
  const int H = prm->H, P = prm->P, L = prm->L, D = prm->D;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
       idx += stride) {
    const int d = (int)(idx % D);
    const int t = (int)((idx / D) % L);
    const long long bh = idx / ((long long)L * D);
    const int h = (int)(bh % H);
    const long long b = bh / H;
    dst[idx] = t < P ? past[(bh * P + t) * D + d] : src[b * sb + h * sh + (t - P) * ss + d];
  }
}

// Block (query tile of BQ rows from s0, query head h, batch b). At most one of mask_b
// (bool as bytes), mask_f and mask_h is set; nonpad may be null.
template <typename T>
__global__ void __launch_bounds__(128) att_prefill(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
    const unsigned char* __restrict__ mask_b, const float* __restrict__ mask_f,
    const __half* __restrict__ mask_h, const long long* __restrict__ nonpad,
    float* __restrict__ part, T* __restrict__ y, const AttParams* __restrict__ prm) {
  extern __shared__ float smem[];
  const long long qsb = prm->qsb, qsh = prm->qsh, qss = prm->qss;
  const long long ksb = prm->ksb, ksh = prm->ksh, kss = prm->kss;
  const long long vsb = prm->vsb, vsh = prm->vsh, vss = prm->vss;
  const long long ysb = prm->ysb, ysh = prm->ysh, yss = prm->yss;
  const long long msb = prm->msb, msh = prm->msh, mss = prm->mss;
  const int Sq = prm->Sq, Sk = prm->Sk, nh = prm->nh, nkv = prm->nkv, D = prm->D;
  const int Dv = prm->Dv, BQ = prm->BQ, BK = prm->BK, causal = prm->causal;
  const int left = prm->left, right = prm->right, mask_cols = prm->mask_cols;
  const int nsplit = prm->nsplit, chunk = prm->chunk;
  const float scale = prm->scale, softcap = prm->softcap;
  const int split = blockIdx.x % nsplit;
  const int b = blockIdx.z, h = blockIdx.y, s0 = (blockIdx.x / nsplit) * BQ;
  const int hk = h / (nh / nkv);
  const int Dp = D + 1;
  float* Qs = smem;           // BQ x D
  float* Ks = Qs + BQ * D;    // BK x (D + 1)
  float* Vs = Ks + BK * Dp;   // BK x Dv
  float* Ps = Vs + BK * Dv;   // BQ x BK
  float* Os = Ps + BQ * BK;   // BQ x Dv
  float* Ms = Os + BQ * Dv;   // BQ
  float* Ls = Ms + BQ;        // BQ
  float* As = Ls + BQ;        // BQ

  const bool has_mask = mask_b != nullptr || mask_f != nullptr || mask_h != nullptr;
  long long off = prm->past;  // position of query row 0
  long long kv_end = Sk;
  if (nonpad != nullptr) {
    const long long np = nonpad[b];
    kv_end = lclamp(np, 0, Sk);
    if (prm->nonpad_offset) off = np - Sq;
  }
  const int rows = imin(BQ, Sq - s0);
  // keys any row of the tile may attend: [lo, hi)
  long long hi = kv_end, lo = 0;
  if (has_mask && mask_cols < hi) hi = mask_cols;
  if (causal && off + s0 + rows < hi) hi = off + s0 + rows;
  if (right >= 0 && off + s0 + rows + right < hi) hi = off + s0 + rows + right;
  if (left >= 0 && off + s0 - left > lo) lo = off + s0 - left;
  if (nsplit > 1) {  // this block's share of the keys
    lo = lo > (long long)split * chunk ? lo : (long long)split * chunk;
    hi = hi < (long long)(split + 1) * chunk ? hi : (long long)(split + 1) * chunk;
  }
  const int j_lo = (int)lclamp(lo, 0, Sk);
  const int j_hi = (int)lclamp(hi, j_lo, Sk);
  const T* kb = k + b * ksb + hk * ksh;
  const T* vb = v + b * vsb + hk * vsh;
  const long long mb0 = b * msb + h * msh;

  for (int idx = threadIdx.x; idx < BQ * D; idx += blockDim.x) {
    const int r = idx / D, d = idx - r * D;
    Qs[idx] = r < rows ? to_f(q[b * qsb + h * qsh + (long long)(s0 + r) * qss + d]) : 0.f;
  }
  for (int idx = threadIdx.x; idx < BQ * Dv; idx += blockDim.x) Os[idx] = 0.f;
  for (int r = threadIdx.x; r < BQ; r += blockDim.x) {
    Ms[r] = ONNXEP_NEG_INF;
    Ls[r] = 0.f;
  }
  for (int jt = j_lo; jt < j_hi; jt += BK) {
    const int kn = imin(BK, j_hi - jt);
    __syncthreads();  // Q/O initialised; the previous tile is consumed
    for (int idx = threadIdx.x; idx < BK * D; idx += blockDim.x) {
      const int jj = idx / D, d = idx - jj * D;
      Ks[jj * Dp + d] = jj < kn ? to_f(kb[(long long)(jt + jj) * kss + d]) : 0.f;
    }
    for (int idx = threadIdx.x; idx < BK * Dv; idx += blockDim.x) {
      const int jj = idx / Dv, d = idx - jj * Dv;
      Vs[idx] = jj < kn ? to_f(vb[(long long)(jt + jj) * vss + d]) : 0.f;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < BQ * BK; idx += blockDim.x) {
      const int r = idx / BK, jj = idx - r * BK;
      const int s = s0 + r, j = jt + jj;
      const long long pos = off + s;
      bool ok = r < rows && jj < kn && (!causal || j <= pos) &&
                (left < 0 || pos - j <= left) && (right < 0 || j - pos <= right);
      const long long mi = mb0 + s * mss + j;
      if (ok && mask_b != nullptr) ok = mask_b[mi] != 0;
      float x = ONNXEP_NEG_INF;
      if (ok) {
        const float* qr = Qs + r * D;
        const float* kr = Ks + jj * Dp;
        float dot = 0.f;
        for (int d = 0; d < D; ++d) dot = fmaf(qr[d], kr[d], dot);
        x = dot * scale;
        if (softcap > 0.f) x = tanhf(x / softcap) * softcap;
        if (mask_f != nullptr) x += mask_f[mi];
        if (mask_h != nullptr) x += to_f(mask_h[mi]);
      }
      Ps[idx] = x;
    }
    __syncthreads();
    softmax_tile(Ps, Ms, Ls, As, BQ, BK);
    __syncthreads();
    accumulate_tile(Os, Ps, Vs, As, BQ, BK, Dv, kn);
  }
  __syncthreads();
  if (nsplit == 1) {
    for (int idx = threadIdx.x; idx < rows * Dv; idx += blockDim.x) {
      const int r = idx / Dv, d = idx - r * Dv;
      const float l = Ls[r];
      y[b * ysb + h * ysh + (long long)(s0 + r) * yss + d] =
          from_f<T>(l > 0.f ? Os[idx] / l : 0.f);
    }
    return;
  }
  // part: m, then l, each [B*nh*Sq][nsplit], then the unnormalised output
  // [B*nh*Sq][nsplit][Dv]; att_reduce merges the splits of each row.
  const long long nrow = (long long)gridDim.z * nh * Sq;
  const long long row0 = ((long long)b * nh + h) * Sq + s0;
  for (int idx = threadIdx.x; idx < rows * Dv; idx += blockDim.x) {
    const int r = idx / Dv, d = idx - r * Dv;
    const long long pr = (row0 + r) * nsplit + split;
    part[2 * nrow * nsplit + pr * Dv + d] = Os[idx];
    if (d == 0) {
      part[pr] = Ms[r];
      part[nrow * nsplit + pr] = Ls[r];
    }
  }
}

// Merges the key splits of one output row: block x = (b * nh + h) * Sq + s.
template <typename T>
__global__ void __launch_bounds__(128) att_reduce(
    const float* __restrict__ part, T* __restrict__ y, const AttParams* __restrict__ prm) {
  const long long ysb = prm->ysb, ysh = prm->ysh, yss = prm->yss;
  const int Sq = prm->Sq, nh = prm->nh, Dv = prm->Dv, nsplit = prm->nsplit;
  const long long row = blockIdx.x;
  const long long nrow = (long long)gridDim.x;
  const int s = (int)(row % Sq);
  const int h = (int)((row / Sq) % nh);
  const long long b = row / ((long long)Sq * nh);
  const float* pm = part + row * nsplit;
  const float* pl = part + nrow * nsplit + row * nsplit;
  const float* pa = part + 2 * nrow * nsplit + row * nsplit * Dv;
  float mx = ONNXEP_NEG_INF;
  for (int c = 0; c < nsplit; ++c) mx = fmaxf(mx, pm[c]);
  for (int d = threadIdx.x; d < Dv; d += blockDim.x) {
    float l = 0.f, a = 0.f;
    if (mx != ONNXEP_NEG_INF) {
      for (int c = 0; c < nsplit; ++c) {
        if (pm[c] == ONNXEP_NEG_INF) continue;
        const float w = expf(pm[c] - mx);
        l += pl[c] * w;
        a += pa[(long long)c * Dv + d] * w;
      }
    }
    y[b * ysb + h * ysh + (long long)s * yss + d] = from_f<T>(l > 0.f ? a / l : 0.f);
  }
}
"""
)

KERNEL_NAMES = ("att_concat", "att_prefill", "att_reduce")
NAME_EXPRESSIONS = instantiations(KERNEL_NAMES)
