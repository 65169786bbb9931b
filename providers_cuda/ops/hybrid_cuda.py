"""CUDA C and launch helpers of the hybrid (Qwen3.5-style) decode ops' small kernels.

One body, compiled once per process, holds the kernels of
LinearAttentionGate, GatedRMSNorm, LpNormalization and CausalConvWithState
(LinearAttention's recurrence is in ``linear_attention_cuda``). Every
operand's element type is a run-time flag (float32, or float16 where its bit
of ``types`` is set), so one compiled kernel serves every mix of float32 and
float16 operands, as real exports mix them (a float16 activation with a
float32 bias or state) and as the CPU kernels accept them: each operand is
widened to float32 on load, all arithmetic is float32, and each result is
rounded once on store. Products that feed a sum are ``__fmul_rn`` so NVRTC
does not fuse them, matching the CPU's rounding.

Compilation goes through ``reduce_cuda.compile_kernels`` (the body follows
its ``PRIMITIVES``), so the tests' kernel emulator runs these kernels too.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from . import reduce_cuda as K
from .reduce_source import COMMON

F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
FLOATS = (F32, F16)
#: Threads per block of the grid-stride kernels.
FLAT_BLOCK = 256
#: Blocks per SM a grid-stride launch aims for (more only queue behind them).
FLAT_BLOCKS_PER_SM = 16

#: Device helpers every hybrid kernel uses (on top of the reductions' COMMON).
HYBRID_COMMON = (
    COMMON
    + r"""
#define HALF(types, bit) (((types) >> (bit)) & 1)

// Element i of an operand that is float16 when `half`, else float32, as float32.
__device__ __forceinline__ float ld(const void* p, i64 i, int half) {
  return half ? to_f(reinterpret_cast<const __half*>(p)[i]) : reinterpret_cast<const float*>(p)[i];
}

__device__ __forceinline__ void st(void* p, i64 i, float v, int half) {
  if (half) {
    reinterpret_cast<__half*>(p)[i] = from_f<__half>(v);
  } else {
    reinterpret_cast<float*>(p)[i] = v;
  }
}

// v rounded to float16 and widened again when `half` (a CPU astype to the storage type).
__device__ __forceinline__ float round_to(float v, int half) {
  return half ? to_f(from_f<__half>(v)) : v;
}

// The CPU kernels' activations (providers/ops/_contrib.py): exp(-|x|) never overflows.
__device__ __forceinline__ float sigmoid_f(float x) {
  const float e = expf(-fabsf(x));
  return x >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
}
__device__ __forceinline__ float silu_f(float x) { return __fmul_rn(x, sigmoid_f(x)); }
__device__ __forceinline__ float softplus_f(float x) {
  return fmaxf(x, 0.f) + log1pf(expf(-fabsf(x)));
}
"""
)

HYBRID_BODY = (
    HYBRID_COMMON
    + r"""
// LinearAttentionGate: decay[i] = decay_scale[c] * softplus(a[i] + dt_bias[c]), c = i % h, over
// the n_a elements of a, then beta[i] = sigmoid(b[i]) over the n_b elements of b (0 when the
// node has no beta output), in one grid-stride pass. Both outputs have a's type.
// types bits: 0 a (and the outputs), 1 dt_bias, 2 decay_scale, 3 b.
__global__ void la_gate(const void* __restrict__ a, const void* __restrict__ dt_bias,
                        const void* __restrict__ decay_scale, const void* __restrict__ b,
                        void* __restrict__ decay, void* __restrict__ beta, i64 n_a, i64 n_b,
                        i64 h, int types) {
  const i64 total = n_a + n_b;
  const int out_half = HALF(types, 0);
  const i64 stride = (i64)gridDim.x * blockDim.x;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
    if (i < n_a) {
      const i64 c = i % h;
      const float z = ld(a, i, HALF(types, 0)) + ld(dt_bias, c, HALF(types, 1));
      st(decay, i, __fmul_rn(ld(decay_scale, c, HALF(types, 2)), softplus_f(z)), out_half);
    } else {
      const i64 j = i - n_a;
      st(beta, j, sigmoid_f(ld(b, j, HALF(types, 3))), out_half);
    }
  }
}

// GatedRMSNorm over rows of n: y = ((x * inv) * w) * act(z) with inv = 1 / sqrt(sum(x * x) / n
// + eps) and act silu (z * sigmoid(z)) or sigmoid. w holds n values (one per row element).
// types bits: 0 x (and y), 1 w, 2 z.
__global__ void gated_rms_norm(const void* __restrict__ x, const void* __restrict__ w,
                               const void* __restrict__ z, void* __restrict__ y, i64 rows,
                               i64 n, float eps, int silu, int tpr, int types) {
  __shared__ float sh[32];
  i64 row;
  int t;
  if (!row_of(tpr, rows, &row, &t)) return;
  const int xh = HALF(types, 0), wh = HALF(types, 1), zh = HALF(types, 2);
  const i64 base = row * n;
  float acc = 0.f;
  for (i64 i = t; i < n; i += tpr) {
    const float v = ld(x, base + i, xh);
    acc += __fmul_rn(v, v);
  }
  acc = row_reduce<R_SUM>(acc, tpr, sh);
  const float inv = 1.f / sqrtf(acc / (float)n + eps);
  for (i64 i = t; i < n; i += tpr) {
    const float g = ld(z, base + i, zh);
    const float act = silu ? silu_f(g) : sigmoid_f(g);
    const float o = __fmul_rn(__fmul_rn(__fmul_rn(ld(x, base + i, xh), inv), ld(w, i, wh)), act);
    st(y, base + i, o, xh);
  }
}

// LpNormalization of x seen as (outer, n, inner) along its middle axis: y = x / norm with
// norm = sum |x| (p == 1) or sqrt(sum x * x) (p == 2), and y = 0 where norm == 0. inner == 1:
// rows as in row_of (tpr 32 or blockDim.x); inner > 1 (tpr == 0): one thread per
// (outer, inner) column, walking the axis twice. types bit 0: x and y are float16.
__global__ void lp_normalize(const void* __restrict__ x, void* __restrict__ y, i64 outer, i64 n,
                             i64 inner, int p, int tpr, int types) {
  __shared__ float sh[32];
  const int xh = HALF(types, 0);
  i64 base, step;
  float acc = 0.f;
  int t = 0, count = 1;
  if (tpr == 0) {
    const i64 col = (i64)blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= outer * inner) return;  // no barrier or shuffle on this path
    base = (col / inner) * n * inner + col % inner;
    step = inner;
  } else {
    i64 row;
    if (!row_of(tpr, outer, &row, &t)) return;
    base = row * n;
    step = 1;
    count = tpr;
  }
  for (i64 i = t; i < n; i += count) {
    const float v = ld(x, base + i * step, xh);
    acc += p == 1 ? fabsf(v) : __fmul_rn(v, v);
  }
  if (tpr != 0) acc = row_reduce<R_SUM>(acc, tpr, sh);
  const float norm = p == 1 ? acc : sqrtf(acc);
  for (i64 i = t; i < n; i += count) {
    const i64 at = base + i * step;
    st(y, at, norm == 0.f ? 0.f : ld(x, at, xh) / norm, xh);
  }
}

// Element s of (batch b, channel c) of a state laid out (B, C, len), or (B, len, C) when
// state_cl.
__device__ __forceinline__ i64 state_at(i64 b, i64 c, i64 s, i64 C, i64 len, int state_cl) {
  return state_cl ? (b * len + s) * C + c : (b * C + c) * len + s;
}

// CausalConvWithState (both domains), a depthwise causal conv over the sequence
// P = [history | x] of each (batch, channel): the history is the s_len values of the past
// state (its slot past_off when windowed; zeros without one). x is read at
// x_off + b * xs_b + c * xs_c + l * xs_l (channels first or last, or a slice of the channels).
// One grid-stride pass over three ranges of work:
//   y (B * C * L): y[b, c, l] = act(sum_j w[c * w_cs + j] * P[start + j * dil + l] + bias[c]),
//     written (B, L, C) when y_cl, else (B, C, L);
//   present (slots * B * C * s_len): slot q holds P[base_q + s], base_q = L - (slots - 1 - q),
//     zeros where window > 0 and base_q <= 0 (a state from before the sequence began);
//   update (B * cap * C): x at positions m < L, channels last, zeros after.
// onnx: the ONNX op's rounding (history and pre-activation rounded to x's type first, silu
// as v / (1 + exp(-v))). types bits: 0 x (and y, update), 1 w, 2 bias, 3 past, 4 present.
__global__ void causal_conv_state(const void* __restrict__ x, const void* __restrict__ w,
                                  const void* __restrict__ bias, const void* __restrict__ past,
                                  void* __restrict__ y, void* __restrict__ present,
                                  void* __restrict__ update, i64 B, i64 C, i64 L, i64 K, i64 dil,
                                  i64 w_cs, i64 x_off, i64 xs_b, i64 xs_c, i64 xs_l, i64 s_len,
                                  i64 past_off, i64 start, int slots, int window, i64 cap,
                                  int y_cl, int state_cl, int silu, int onnx, int types) {
  const int xh = HALF(types, 0), wh = HALF(types, 1), bh = HALF(types, 2);
  const int ph = HALF(types, 3), qh = HALF(types, 4);
  const i64 n_y = B * C * L;
  const i64 n_state = (i64)slots * B * C * s_len;
  const i64 total = n_y + n_state + B * cap * C;
  const i64 stride = (i64)gridDim.x * blockDim.x;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
    if (i < n_y) {
      i64 b, c, l;
      if (y_cl) {
        c = i % C;
        l = (i / C) % L;
        b = i / (C * L);
      } else {
        l = i % L;
        c = (i / L) % C;
        b = i / (L * C);
      }
      float acc = 0.f;
      for (i64 j = 0; j < K; ++j) {
        const i64 m = start + j * dil + l;
        float v;
        if (m >= s_len) {
          v = ld(x, x_off + b * xs_b + c * xs_c + (m - s_len) * xs_l, xh);
        } else if (past != nullptr) {
          v = ld(past, past_off + state_at(b, c, m, C, s_len, state_cl), ph);
          if (onnx) v = round_to(v, xh);
        } else {
          v = 0.f;
        }
        acc += __fmul_rn(ld(w, c * w_cs + j, wh), v);
      }
      if (bias != nullptr) acc += ld(bias, c, bh);
      if (silu) {
        if (onnx) {
          acc = round_to(acc, xh);
          acc = acc / (1.f + expf(-acc));
        } else {
          acc = silu_f(acc);
        }
      }
      st(y, i, acc, xh);
    } else if (i < n_y + n_state) {
      const i64 e = i - n_y;
      const i64 per_slot = B * C * s_len;
      const i64 q = e / per_slot;
      const i64 r = e % per_slot;
      i64 b, c, s;
      if (state_cl) {
        c = r % C;
        s = (r / C) % s_len;
        b = r / (C * s_len);
      } else {
        s = r % s_len;
        c = (r / s_len) % C;
        b = r / (s_len * C);
      }
      const i64 base_q = L - (slots - 1 - q);
      float v = 0.f;
      if (window == 0 || base_q > 0) {
        const i64 m = base_q + s;
        if (m >= s_len) {
          v = ld(x, x_off + b * xs_b + c * xs_c + (m - s_len) * xs_l, xh);
        } else if (past != nullptr) {
          v = ld(past, past_off + state_at(b, c, m, C, s_len, state_cl), ph);
          if (onnx) v = round_to(v, xh);
        }
      }
      st(present, e, v, qh);
    } else {
      const i64 e = i - n_y - n_state;
      const i64 c = e % C;
      const i64 m = (e / C) % cap;
      const i64 b = e / (C * cap);
      st(update, e, m < L ? ld(x, x_off + b * xs_b + c * xs_c + m * xs_l, xh) : 0.f, xh);
    }
  }
}
"""
)

HYBRID_NAMES = ("la_gate", "gated_rms_norm", "lp_normalize", "causal_conv_state")


def hybrid_kernel(name: str) -> Any:
    """One kernel of HYBRID_BODY, compiled (with the others, once per process) now."""
    return K.compile_kernels(HYBRID_BODY, HYBRID_NAMES)[name]


def type_bits(*dtypes: Any) -> np.int32:
    """The kernels' ``types`` argument: bit i set when operand i's dtype is float16 (None, an
    absent operand, counts as float32)."""
    bits = 0
    for i, dt in enumerate(dtypes):
        if dt is not None and np.dtype(dt) == F16:
            bits |= 1 << i
    return np.int32(bits)


def float_refusal(op: str, what: str, dtype: Any) -> str | None:
    """Why ``what`` of dtype ``dtype`` cannot go to the kernels (None: float32/float16)."""
    if dtype is None or np.dtype(dtype) in FLOATS:
        return None
    return f"{op}: {what} is {np.dtype(dtype).name}; the CUDA kernel takes float32 and float16"


def flat_grid(n: int) -> tuple[int]:
    """Blocks of FLAT_BLOCK threads for a grid-stride loop over ``n`` items."""
    return (max(1, min(-(-n // FLAT_BLOCK), K.sm_count() * FLAT_BLOCKS_PER_SM)),)


def contiguity_test(xp: Any) -> Callable[[Any], bool]:
    """The cheapest C-contiguity test ``xp``'s arrays offer (CuPy's ``flags`` builds an object
    per call; its arrays also carry a plain ``c_contiguous`` attribute)."""
    probe = xp.empty(1)
    if isinstance(getattr(probe, "c_contiguous", None), bool):
        return operator.attrgetter("c_contiguous")
    return lambda a: a.flags.c_contiguous


def contiguous(xp: Any, test: Callable[[Any], bool], arrays: Sequence[Any]) -> list[Any]:
    """The arrays as the kernels read them: C-contiguous (a copy only where one is not)."""
    return [a if a is None or test(a) else xp.ascontiguousarray(a) for a in arrays]


def signature(arrays: Sequence[Any]) -> tuple:
    """The key a node's launch plans are cached under: each input's shape and dtype."""
    return tuple(None if a is None else (a.shape, a.dtype) for a in arrays)


def rows_geometry(rows: int, n: int) -> tuple[tuple[int], tuple[int], np.int32] | None:
    """``(grid, block, tpr)`` of a row kernel (``row_of``): a warp per short row, else a block
    sized to the row; None when the grid would not fit. No rows: a grid of 0 (do not launch)."""
    tpr = K.row_threads(n)
    if tpr == K.WARP:
        grid, block = K.warp_rows_grid(rows), K.BLOCK
    else:
        grid, block = rows, tpr
    if grid > K.MAX_GRID:
        return None
    return (grid,), (block,), np.int32(tpr)
