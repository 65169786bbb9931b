"""The rotary-embedding kernel behind both RotaryEmbedding ops (ONNX opset 23, com.microsoft).

One grid-stride kernel rotates the first ``rot`` channels of every head and
copies the rest. It reads positions on the device in four ways (``PosMode``),
so a step never reads position ids back to the host; an id outside the cos/sin
cache turns the channels it rotates into NaN instead of reading out of bounds
and is recorded in the provider's error flag, which raises the CPU kernels'
error at the run's next read of its results.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument

from .attention_cuda import COMMON_SOURCE, ctype_of, flat_grid, instantiations, params, sm_count

ROPE = params(
    "RopeParams",
    i64="n",
    i32="B S N D rot interleaved half layout_bnsd pos_mode cache_rows bcast_b sec0 sec1 sec2 "
    "mrope_layout node",
    f32="cs_scale",
)

ROPE_SOURCE = (
    COMMON_SOURCE
    + ROPE.source
    + r"""
// The position stream (0 = temporal, 1 = height, 2 = width) that cos/sin column i
// reads under multimodal RoPE: contiguous sections (layout 0) or interleaved
// (layout 1: H on columns 1, 4, 7.., W on 2, 5, 8.., T elsewhere).
__device__ __forceinline__ int mrope_stream(int i, int layout, int s0, int s1, int s2) {
  if (layout == 0) {
    if (i < s0) return 0;
    if (i < s0 + s1) return 1;
    if (i < s0 + s1 + s2) return 2;
    return 0;
  }
  const int r = i % 3;
  if (r == 1 && i < s1 * 3) return 1;
  if (r == 2 && i < s2 * 3) return 2;
  return 0;
}

// y = x with rotary embedding on the first `rot` channels of every head.
// x and y are (B, N, S, D) when layout_bnsd, else (B, S, N, D).
// pos_mode 0: cos/sin are per-token tables (B or 1, S, half);
//          1: position = pos[0] + s;  2: position = pos[b, s] (pos batch 1 broadcasts);
//          3: position = pos[stream(i), b, s] (multimodal RoPE).
// A position outside the cache's cache_rows rows makes the rotated channels NaN (a clamped
// row would pass unseen) and is recorded in flag (the provider's error record, or null) by
// channel 0 of head 0, for the first token of a run of bad ones.
__device__ __forceinline__ bool rope_bad(long long p, int rows) { return p < 0 || p >= rows; }

__device__ void rope_check(int* flag, int node, int pos_mode, const long long* pos, int B,
                           int S, int bb, int b, int s, int rows, int nb) {
  if (pos_mode == 1) {
    const long long p = pos[0] + s;
    if (rope_bad(p, rows) && (s == 0 || !rope_bad(p - 1, rows)))
      onnxep_fault(flag, node, ONNXEP_FAULT_POSITION, ONNXEP_FROM_FIRST_ID, p, s, rows, 1, S);
    return;
  }
  for (int st = 0; st < (pos_mode == 3 ? 3 : 1); ++st) {
    const long long at = pos_mode == 3 ? ((long long)st * B + b) * S + s : (long long)bb * S + s;
    const long long p = pos[at];
    if (rope_bad(p, rows) && (s == 0 || !rope_bad(pos[at - 1], rows)))
      onnxep_fault(flag, node, ONNXEP_FAULT_POSITION, ONNXEP_FROM_IDS, p, at, rows,
                   (pos_mode == 3 ? 3LL * B : (long long)nb) * S, S);
  }
}

template <typename T>
__global__ void __launch_bounds__(256) rope_apply(
    const T* __restrict__ x, T* __restrict__ y, const T* __restrict__ cosc,
    const T* __restrict__ sinc, const long long* __restrict__ pos, int* flag,
    const RopeParams* __restrict__ prm) {
  const long long n = prm->n;
  const int B = prm->B, S = prm->S, N = prm->N, D = prm->D, rot = prm->rot;
  const int interleaved = prm->interleaved, half = prm->half, layout_bnsd = prm->layout_bnsd;
  const int pos_mode = prm->pos_mode, cache_rows = prm->cache_rows, bcast_b = prm->bcast_b;
  const int sec0 = prm->sec0, sec1 = prm->sec1, sec2 = prm->sec2;
  const int mrope_layout = prm->mrope_layout, node = prm->node;
  const float cs_scale = prm->cs_scale;
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
       idx += stride) {
    const int d = (int)(idx % D);
    if (d >= rot) {
      y[idx] = x[idx];
      continue;
    }
    const long long row = idx / D;
    int b, s, h;
    if (layout_bnsd) {
      s = (int)(row % S);
      h = (int)((row / S) % N);
      b = (int)(row / ((long long)N * S));
    } else {
      h = (int)(row % N);
      s = (int)((row / N) % S);
      b = (int)(row / ((long long)S * N));
    }
    const int bb = bcast_b ? 0 : b;
    if (pos_mode != 0 && d == 0 && h == 0)
      rope_check(flag, node, pos_mode, pos, B, S, bb, b, s, cache_rows, bcast_b ? 1 : B);
    long long p;
    if (pos_mode == 0) {
      p = (long long)bb * S + s;
    } else {
      if (pos_mode == 1) {
        p = pos[0] + s;
      } else if (pos_mode == 2) {
        p = pos[(long long)bb * S + s];
      } else {
        const int i = interleaved ? (d >> 1) : (d < (rot >> 1) ? d : d - (rot >> 1));
        const int st = mrope_stream(i, mrope_layout, sec0, sec1, sec2);
        p = pos[((long long)st * B + b) * S + s];
      }
      if (p < 0 || p >= cache_rows) {
        y[idx] = from_f<T>(ONNXEP_NAN);
        continue;
      }
    }
    const long long off = p * half;
    y[idx] = from_f<T>(
        rope_channel<T>(x + row * D, d, rot, interleaved, cosc + off, sinc + off, cs_scale));
  }
}
"""
)

_NAMES = instantiations(("rope_apply",))


class PosMode(enum.IntEnum):
    TABLE = 0  # cos/sin already gathered per token
    OFFSET = 1  # one start position
    IDS = 2  # one position per (batch, token)
    MROPE = 3  # three position streams


class RopeKernel:
    """The compiled rotary kernel for one dtype, launched on CuPy's current stream."""

    def __init__(self, dtype: Any, op: str = "", node_name: str = "") -> None:
        from onnxep.providers_cuda import error_flag, nvrtc

        self._fns = {
            np.dtype(dt): nvrtc.function(ROPE_SOURCE, f"rope_apply<{ctype_of(dt)}>", _NAMES)
            for dt in ((np.float32, np.float16) if dtype is None else (dtype,))
        }
        self._sms = sm_count()
        # the provider's error record, where a position outside the cache is reported
        self._flag = error_flag.current()
        self._node = self._flag.register(op, node_name) if self._flag is not None else -1
        self._words = self._flag.words if self._flag is not None else None
        # parameter blocks in device memory, one per distinct shape (written on first use,
        # so a shape's first call is not capturable -- warm-up runs make them)
        self._params: dict[tuple, Any] = {}

    def __call__(
        self,
        xp: Any,
        x: Any,
        cos: Any,
        sin: Any,
        pos: Any,
        *,
        op: str,
        bnsd: bool,
        shape: tuple[int, int, int, int],
        rot: int,
        interleaved: bool,
        mode: PosMode,
        bcast_b: bool = False,
        section: tuple[int, int, int] = (0, 0, 0),
        mrope_layout: int = 0,
        cs_scale: float = 1.0,
    ) -> Any:
        """``x`` rotated; ``shape`` is (B, N, S, D) whatever the layout."""
        b, n, s, d = shape
        fn = self._fns.get(x.dtype)
        if fn is None:
            raise InvalidArgument(f"{op}: input of dtype {x.dtype} is not float32 or float16")
        half = cos.shape[-1]
        if rot % 2 or rot > d or rot <= 0:
            raise InvalidArgument(
                f"{op}: rotary dim {rot} must be even and within the head size {d}"
            )
        if half != rot // 2 or sin.shape != cos.shape:
            raise InvalidArgument(
                f"{op}: cos/sin caches of shapes {tuple(cos.shape)}/{tuple(sin.shape)} do not "
                f"hold rotary_dim/2 = {rot // 2} values per position"
            )
        x = xp.ascontiguousarray(x)
        cos = xp.ascontiguousarray(cos if cos.dtype == x.dtype else cos.astype(x.dtype))
        sin = xp.ascontiguousarray(sin if sin.dtype == x.dtype else sin.astype(x.dtype))
        if pos is not None:
            pos = xp.ascontiguousarray(pos if pos.dtype == np.int64 else pos.astype(np.int64))
        y = xp.empty_like(x)
        total = x.size
        if total == 0:
            return y
        rows = cos.shape[0] if mode != PosMode.TABLE else cos.shape[0] * s
        key = (total, b, s, n, d, rot, interleaved, half, bnsd, int(mode), rows, bcast_b,
               section, mrope_layout, cs_scale)  # fmt: skip
        prm = self._params.get(key)
        if prm is None:
            if len(self._params) >= 64:
                self._params.clear()
            prm = self._params[key] = ROPE.to_device(
                xp, n=total, B=b, S=s, N=n, D=d, rot=rot, interleaved=interleaved, half=half,
                layout_bnsd=bnsd, pos_mode=int(mode), cache_rows=rows, bcast_b=bcast_b,
                sec0=section[0], sec1=section[1], sec2=section[2], mrope_layout=mrope_layout,
                cs_scale=cs_scale, node=self._node,
            )  # fmt: skip
        if pos is not None and self._flag is not None:
            self._flag.shapes[self._node] = tuple(pos.shape)  # where a bad id sits
        fn((flat_grid(total, self._sms),), (256,), (x, y, cos, sin, pos, self._words, prm))
        return y
