"""CUDA C of the tensor-core attention prefill (FlashAttention-2's schedule, written here).

One block of 4 warps per (query tile, query head, batch); each warp owns one or
two m16 tiles of query rows (``MT``: two halve the shared-memory reads per product,
one K or V fragment serving both, at the price of twice the registers and half the
blocks; the plan picks, ``_flash_prefill.m_tiles``). Key/value tiles of BK rows
stream through shared memory (``cp.async``, 16-byte copies, rows padded by 8
elements so ``ldmatrix`` reads hit distinct banks); the V tile's copy overlaps
Q.K^T and the next K tile's copy overlaps P.V. Scores and the output accumulate
in float32 registers through ``mma.sync.aligned.m16n8k16`` (fp16 or bf16
operands); the online
softmax keeps each row's running max (in log2 units) and its sum in
registers, and the probabilities become the P.V product's A fragments in
place (the C layout of two n8 tiles is the A layout of one k16 step), rounded
to the input type once, as FlashAttention does. Head sizes are template
arguments (any multiple of 16 up to 256): for D <= 128 a warp's Q fragments
stay in registers (Q's shared tile is then V's buffer), above that they are
re-read from shared memory each step.

Why ``mma.sync`` through inline PTX, not WMMA or a library: WMMA hides the
fragment layout, so the probabilities would go through shared memory between
the two products; cuDNN's flash attention and FlashAttention-3 (wgmma/TMA)
are not callable from CuPy without another binding or a build of C++
templates; ``mma.sync`` runs on every GPU from sm_80 (the H200 included) and
its layouts are documented in the PTX ISA, so the emulator
(``tests/cuda_emulation.py``) implements the same instructions and a layout
mistake shows there as a wrong result.

Semantics are those of the scalar kernels it replaces (``_gqa_cuda.gqa_prefill``
and ``_attention23_cuda.att_prefill``): query row ``s`` of batch row ``b`` sits
at position ``off + s`` and attends keys ``j < kv_end`` (within the mask's
columns) with ``j <= pos`` when causal, ``pos - j <= left`` and ``j - pos <=
right`` for windows; scores are ``dot * scale``, soft-capped, plus a bias or
float mask, or dropped by a bool mask; a row with no key gives zeros, and a
sink (GroupQueryAttention's head_sink or smooth softmax) joins the denominator.
``mode`` 0 takes ``off``/``kv_end`` from ``seqlens_k`` (GroupQueryAttention),
1 from ``past`` and ``nonpad_kv_seqlen`` (ONNX Attention).

The tiles a causal block needs end at its last row's position: later tiles are
never loaded; tiles wholly inside every row's window take no per-element
masking. Blocks start with the longest query tiles (the last ones).
"""

from __future__ import annotations

from ._attention_cuda import COMMON_SOURCE, params

FLASH = params(
    "FlashParams",
    i64="qsb qsh qss ksb ksh kss vsb vsh vss ysb ysh yss msb msh mss msj past",
    i32="Sq Sk nh nkv kv_limit causal left right mask_cols mode nonpad_offset smooth",
    f32="scale softcap",
)
#: ``mode`` values.
MODE_GQA, MODE_ATTENTION = 0, 1

FLASH_SOURCE = (
    COMMON_SOURCE
    + FLASH.source
    + r"""
#define FLASH_LOG2E 1.4426950408889634f

// bfloat16 as its 16 bits (cuda_bf16.h is not needed: only conversions are).
struct bf16_t { unsigned short bits; };
__device__ __forceinline__ float to_f(bf16_t x) { return __uint_as_float((unsigned)x.bits << 16); }
template <> __device__ __forceinline__ bf16_t from_f<bf16_t>(float x) {
  const unsigned u = __float_as_uint(x);
  bf16_t r;
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    r.bits = (unsigned short)((u >> 16) | 0x40u);  // a quiet NaN stays NaN
  } else {
    r.bits = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // nearest, ties to even
  }
  return r;
}
__device__ __forceinline__ unsigned bits_of(__half x) { return __half_as_ushort(x); }
__device__ __forceinline__ unsigned bits_of(bf16_t x) { return x.bits; }

// Two floats rounded to T, the first in the low half (the element with the lower index).
template <typename T>
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  return bits_of(from_f<T>(lo)) | (bits_of(from_f<T>(hi)) << 16);
}

#ifndef ONNXEP_EMULATOR
// The warp-level instructions; tests/cuda_emulation.py has host versions of each.
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  unsigned r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}

// 16 bytes global -> shared, asynchronous; when !valid the 16 bytes are zeros (src unread).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)),
               "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits for every cp.async this thread issued (committed or not).
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, and register i
// of lane l gets row l/4, elements 2(l%4) and 2(l%4)+1 of matrix i (_t: its transpose).
__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// d (16x8, float32) += a (16x16, row-major fragments) * b (16x8, column-major fragments).
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1);
template <>
__device__ __forceinline__ void mma16816<__half>(float (&d)[4], const unsigned (&a)[4],
                                                 unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<bf16_t>(float (&d)[4], const unsigned (&a)[4],
                                                 unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

// Rows [r0, r0 + n) of a (rows x D) matrix with row stride `stride` into a shared tile of
// ROWS rows of D + 8 elements; rows past n become zeros.
template <typename T, int D, int ROWS>
__device__ __forceinline__ void flash_load(T* dst, const T* src, long long stride, int r0,
                                           int n) {
  constexpr int CH = D / 8;
  for (int c = threadIdx.x; c < ROWS * CH; c += blockDim.x) {
    const int r = c / CH, d0 = (c - r * CH) * 8;
    const bool ok = r < n;
    cp_async16(dst + r * (D + 8) + d0, src + (long long)(r0 + (ok ? r : 0)) * stride + d0, ok);
  }
}

// Block (query tile, query head h, batch b): 4 warps of MT m16 tiles of query rows each.
// At most one of mask_b (bool as bytes), mask_f, mask_h and mask_t (T, GroupQueryAttention's
// bias) is set. Per warp, tile i's accumulators 0, 1 are row g of the tile, 2, 3 row g + 8
// (g = lane / 4), columns 2 (lane % 4) and +1 of each n8 block.
template <typename T, int D, int BK, int QREG, int MT>
__global__ void __launch_bounds__(128) flash_prefill(
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
    const int* __restrict__ seqlens_k, const int* __restrict__ q_seqlens,
    const long long* __restrict__ nonpad, const unsigned char* __restrict__ mask_b,
    const float* __restrict__ mask_f, const __half* __restrict__ mask_h,
    const T* __restrict__ mask_t, const T* __restrict__ sink, T* __restrict__ y,
    const FlashParams* __restrict__ prm) {
  constexpr int WR = 16 * MT, BQ = 4 * WR, LD = D + 8, KT = D / 16, NT = BK / 8, DT = D / 8;
  constexpr bool ALIAS = QREG && BQ <= BK;  // Q's tile is V's buffer until Q is in registers
  extern __shared__ float smem[];
  T* ks = reinterpret_cast<T*>(smem);  // BK x LD
  T* vs = ks + BK * LD;                // BK x LD
  T* qs = ALIAS ? vs : vs + BK * LD;   // BQ x LD

  const long long msb = prm->msb, msh = prm->msh, mss = prm->mss, msj = prm->msj;
  const int Sq = prm->Sq, Sk = prm->Sk, nh = prm->nh, nkv = prm->nkv;
  const int causal = prm->causal, left = prm->left, right = prm->right;
  const float scale = prm->scale, softcap = prm->softcap;
  const int b = blockIdx.z, h = blockIdx.y;
  const int s0 = (gridDim.x - 1 - blockIdx.x) * BQ;  // the longest (last) query tiles first
  const int hk = h / (nh / nkv);

  // Position of query row 0 and the keys the batch row holds.
  long long off, kv_end;
  if (prm->mode == 0) {  // GroupQueryAttention: T = seqlens_k + 1, Q = min(T, S) new rows
    const int tlen = seqlens_k[b] + 1;
    const int qlen = q_seqlens != nullptr ? q_seqlens[b] : imin(tlen, Sq);
    off = (long long)tlen - qlen;
    kv_end = lclamp(imin(tlen, prm->kv_limit), 0, Sk);
  } else {  // Attention: the past length, or nonpad_kv_seqlen's
    off = prm->past;
    kv_end = Sk;
    if (nonpad != nullptr) {
      const long long np = nonpad[b];
      kv_end = lclamp(np, 0, Sk);
      if (prm->nonpad_offset) off = np - Sq;
    }
  }
  if (prm->mask_cols < kv_end) kv_end = prm->mask_cols;
  const int rows = imin(BQ, Sq - s0);
  long long hi = kv_end, lo = 0;  // keys any row of the tile may attend: [lo, hi)
  if (causal && off + s0 + rows < hi) hi = off + s0 + rows;
  if (right >= 0 && off + s0 + rows + right < hi) hi = off + s0 + rows + right;
  if (left >= 0 && off + s0 - left > lo) lo = off + s0 - left;
  const int j_lo = (int)lclamp(lo, 0, Sk);
  const int j_hi = (int)lclamp(hi, j_lo, Sk);

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t4 = lane & 3;
  const int w0 = warp * WR;                     // the warp's first tile row
  const int ra = w0 + (lane >> 2);              // this lane's row in the warp's first m16 tile
  const long long wpos = off + s0 + w0;         // position of the warp's first row
  const T* qb = q + b * prm->qsb + h * prm->qsh;
  const T* kb = k + b * prm->ksb + hk * prm->ksh;
  const T* vb = v + b * prm->vsb + hk * prm->vsh;
  const long long kss = prm->kss, vss = prm->vss;
  const bool has_mask = mask_b != nullptr || mask_f != nullptr || mask_h != nullptr ||
                        mask_t != nullptr;
  const bool plain = !has_mask && softcap <= 0.f;
  const float scale2 = scale * FLASH_LOG2E;
  // ldmatrix row addresses: A fragments (Q) and V^T walk rows by lane bit 3, K by lane bit 4
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8, a_col = (lane >> 4) * 8;
  const int b_row = (lane & 7) + (lane >> 4) * 8, b_col = ((lane >> 3) & 1) * 8;

  unsigned qf[MT][QREG ? KT : 1][4];
  float o[MT][DT][4];
  float m[MT][2], l[MT][2];  // each row's running max (log2 units) and this lane's sum share
#pragma unroll
  for (int t = 0; t < MT; ++t) {
#pragma unroll
    for (int i = 0; i < DT; ++i) o[t][i][0] = o[t][i][1] = o[t][i][2] = o[t][i][3] = 0.f;
    m[t][0] = m[t][1] = ONNXEP_NEG_INF;
    l[t][0] = l[t][1] = 0.f;
  }

  if (j_lo < j_hi) {
    flash_load<T, D, BQ>(qs, qb, prm->qss, s0, rows);
    flash_load<T, D, BK>(ks, kb, kss, j_lo, imin(BK, j_hi - j_lo));
    cp_async_commit();
  }
  for (int jt = j_lo; jt < j_hi; jt += BK) {
    cp_async_wait_all();
    __syncthreads();  // K (first: and Q) landed for every thread; nobody reads V any more
    if constexpr (QREG) {
      if (jt == j_lo) {
#pragma unroll
        for (int t = 0; t < MT; ++t)
#pragma unroll
          for (int kk = 0; kk < KT; ++kk)
            ldsm_x4(qf[t][kk], qs + (w0 + 16 * t + a_row) * LD + kk * 16 + a_col);
        if constexpr (ALIAS) __syncthreads();  // Q is in registers before V's copy lands
      }
    }
    flash_load<T, D, BK>(vs, vb, vss, jt, imin(BK, j_hi - jt));
    cp_async_commit();

    float s[MT][NT][4];
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int i = 0; i < NT; ++i) s[t][i][0] = s[t][i][1] = s[t][i][2] = s[t][i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
      unsigned a[MT][4];
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        if constexpr (QREG) {
          a[t][0] = qf[t][kk][0], a[t][1] = qf[t][kk][1];
          a[t][2] = qf[t][kk][2], a[t][3] = qf[t][kk][3];
        } else {
          ldsm_x4(a[t], qs + (w0 + 16 * t + a_row) * LD + kk * 16 + a_col);
        }
      }
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        unsigned kf[4];  // one K fragment serves the warp's MT tiles
        ldsm_x4(kf, ks + (np * 16 + b_row) * LD + kk * 16 + b_col);
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          mma16816<T>(s[t][2 * np], a[t], kf[0], kf[1]);
          mma16816<T>(s[t][2 * np + 1], a[t], kf[2], kf[3]);
        }
      }
    }

    // Scores in log2 units; a tile inside every row's window and mask takes no checks.
    const bool full = plain && jt + BK <= j_hi && (!causal || jt + BK - 1 <= wpos) &&
                      (left < 0 || wpos + WR - 1 - jt <= left) &&
                      (right < 0 || jt + BK - 1 - wpos <= right);
#pragma unroll
    for (int t = 0; t < MT; ++t) {
      if (full) {
#pragma unroll
        for (int i = 0; i < NT; ++i)
#pragma unroll
          for (int c = 0; c < 4; ++c) s[t][i][c] *= scale2;
      } else {
#pragma unroll
        for (int i = 0; i < NT; ++i) {
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int j = jt + i * 8 + 2 * t4 + (c & 1);
            const int r = ra + 16 * t + (c >> 1) * 8;
            const long long pos = wpos + (r - w0);
            bool ok = r < rows && j < j_hi && (!causal || j <= pos) &&
                      (left < 0 || pos - j <= left) && (right < 0 || j - pos <= right);
            float x = ONNXEP_NEG_INF;
            if (ok && has_mask) {
              const long long mi = b * msb + h * msh + (long long)(s0 + r) * mss + j * msj;
              if (mask_b != nullptr) ok = mask_b[mi] != 0;
              if (ok) {
                x = s[t][i][c] * scale;
                if (softcap > 0.f) x = tanhf(x / softcap) * softcap;
                if (mask_f != nullptr) x += mask_f[mi];
                if (mask_h != nullptr) x += to_f(mask_h[mi]);
                if (mask_t != nullptr) x += to_f(mask_t[mi]);
                x *= FLASH_LOG2E;
              }
            } else if (ok) {
              x = s[t][i][c] * scale;
              if (softcap > 0.f) x = tanhf(x / softcap) * softcap;
              x *= FLASH_LOG2E;
            }
            s[t][i][c] = x;
          }
        }
      }

      // Online softmax: the quad of lanes sharing a row meets by shuffles.
      float mx0 = m[t][0], mx1 = m[t][1];
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        mx0 = fmaxf(mx0, fmaxf(s[t][i][0], s[t][i][1]));
        mx1 = fmaxf(mx1, fmaxf(s[t][i][2], s[t][i][3]));
      }
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
      mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
      mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
      // a row with no key so far subtracts 0: its scores are all -inf, exp2 gives zeros
      const float mu0 = mx0 == ONNXEP_NEG_INF ? 0.f : mx0;
      const float mu1 = mx1 == ONNXEP_NEG_INF ? 0.f : mx1;
      const float al0 = exp2f(m[t][0] - mu0), al1 = exp2f(m[t][1] - mu1);
      m[t][0] = mx0;
      m[t][1] = mx1;
      float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
      for (int i = 0; i < NT; ++i) {
        s[t][i][0] = exp2f(s[t][i][0] - mu0);
        s[t][i][1] = exp2f(s[t][i][1] - mu0);
        s[t][i][2] = exp2f(s[t][i][2] - mu1);
        s[t][i][3] = exp2f(s[t][i][3] - mu1);
        ps0 += s[t][i][0] + s[t][i][1];
        ps1 += s[t][i][2] + s[t][i][3];
      }
      l[t][0] = l[t][0] * al0 + ps0;
      l[t][1] = l[t][1] * al1 + ps1;
#pragma unroll
      for (int i = 0; i < DT; ++i) {
        o[t][i][0] *= al0;
        o[t][i][1] *= al0;
        o[t][i][2] *= al1;
        o[t][i][3] *= al1;
      }
    }

    cp_async_wait_all();
    __syncthreads();  // V landed for every thread; every warp is done with K
    if (jt + BK < j_hi) {
      flash_load<T, D, BK>(ks, kb, kss, jt + BK, imin(BK, j_hi - jt - BK));
      cp_async_commit();
    }
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      unsigned a[MT][4];
#pragma unroll
      for (int t = 0; t < MT; ++t) {
        a[t][0] = pack2<T>(s[t][2 * kk][0], s[t][2 * kk][1]);
        a[t][1] = pack2<T>(s[t][2 * kk][2], s[t][2 * kk][3]);
        a[t][2] = pack2<T>(s[t][2 * kk + 1][0], s[t][2 * kk + 1][1]);
        a[t][3] = pack2<T>(s[t][2 * kk + 1][2], s[t][2 * kk + 1][3]);
      }
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        unsigned vf[4];  // one V fragment serves the warp's MT tiles
        ldsm_x4_t(vf, vs + (kk * 16 + a_row) * LD + dp * 16 + a_col);
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          mma16816<T>(o[t][2 * dp], a[t], vf[0], vf[1]);
          mma16816<T>(o[t][2 * dp + 1], a[t], vf[2], vf[3]);
        }
      }
    }
  }

  const bool has_sink = sink != nullptr || prm->smooth != 0;
  const float sk = sink != nullptr ? to_f(sink[h]) * FLASH_LOG2E : 0.f;
  T* yb = y + b * prm->ysb + h * prm->ysh;
  const long long yss = prm->yss;
#pragma unroll
  for (int t = 0; t < MT; ++t) {
    float f[2];  // the factor each of the lane's two rows is scaled by
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float lt = l[t][e];
      lt += __shfl_xor_sync(0xffffffffu, lt, 1);
      lt += __shfl_xor_sync(0xffffffffu, lt, 2);
      if (has_sink) {
        const float mf = fmaxf(m[t][e], sk);
        const float a = exp2f(m[t][e] - mf);
        f[e] = a / (lt * a + exp2f(sk - mf));
      } else {
        f[e] = lt > 0.f ? 1.f / lt : 0.f;
      }
    }
    const int r = ra + 16 * t;
#pragma unroll
    for (int i = 0; i < DT; ++i) {
      const int d = i * 8 + 2 * t4;
      if (r < rows)
        *reinterpret_cast<unsigned*>(yb + (long long)(s0 + r) * yss + d) =
            pack2<T>(o[t][i][0] * f[0], o[t][i][1] * f[0]);
      if (r + 8 < rows)
        *reinterpret_cast<unsigned*>(yb + (long long)(s0 + r + 8) * yss + d) =
            pack2<T>(o[t][i][2] * f[1], o[t][i][3] * f[1]);
    }
  }
}
"""
)

#: Element types the kernel takes, by NumPy dtype name (bfloat16 is ml_dtypes').
FLASH_CTYPES = {"float16": "__half", "bfloat16": "bf16_t"}


def kernel_name(ctype: str, d: int, bk: int, q_in_registers: bool, m_tiles: int) -> str:
    """The template instantiation for one element type and tile shape."""
    return f"flash_prefill<{ctype}, {d}, {bk}, {int(q_in_registers)}, {m_tiles}>"
