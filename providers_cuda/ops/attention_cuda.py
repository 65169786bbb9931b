"""CUDA C shared by the attention and rotary kernels, and the device facts their geometry uses.

Everything here imports without CuPy: the CUDA source is plain strings, and
CuPy is imported only inside the functions that talk to a device.

Numerics follow the CPU reference (``providers/ops/_attention.py``): inputs
are widened to float32, every sum accumulates in float32, and results are
rounded back once (round-to-nearest-even, as NumPy's ``astype`` does). The
rotary products use ``__fmul_rn``/``__fadd_rn``/``__fsub_rn`` so the compiler
cannot contract them into FMAs: a rotated value is then the same float the
CPU computes, bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..error_flag import RECORD_SOURCE

#: The CUDA element type of each supported NumPy dtype.
CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float16): "__half"}

COMMON_SOURCE = (
    r"""
#include <cuda_fp16.h>

#define ONNXEP_NEG_INF (-__int_as_float(0x7f800000))
#define ONNXEP_NAN __int_as_float(0x7fc00000)

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f<__half>(float x) {
  return __float2half_rn(x);
}

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }
__device__ __forceinline__ long long lclamp(long long v, long long lo, long long hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One key tile's online-softmax step for a tile of BQ query rows (a warp per row): each row
// of the BQ x BK scores in ps becomes its probabilities against the new running max ms, the
// running sum ls is rescaled and grown, and as gets the factor the row's output is rescaled by.
__device__ __forceinline__ void softmax_tile(float* ps, float* ms, float* ls, float* as, int BQ,
                                             int BK) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
  for (int r = warp; r < BQ; r += nw) {
    float* pr = ps + r * BK;
    float mt = ONNXEP_NEG_INF;
    for (int jj = lane; jj < BK; jj += 32) mt = fmaxf(mt, pr[jj]);
    mt = warp_max(mt);
    const float mo = ms[r];
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
      as[r] = a;
      ms[r] = mn;
      ls[r] = ls[r] * a + sum;
    }
  }
}

// Each row's output os (BQ x Dv) rescaled by as, plus the row's probabilities (ps, BQ x BK)
// times the tile's first kn value rows (vs, BK x Dv).
__device__ __forceinline__ void accumulate_tile(float* os, const float* ps, const float* vs,
                                                const float* as, int BQ, int BK, int Dv,
                                                int kn) {
  for (int idx = threadIdx.x; idx < BQ * Dv; idx += blockDim.x) {
    const int r = idx / Dv, d = idx - r * Dv;
    const float* pr = ps + r * BK;
    float o = os[idx] * as[r];
    for (int jj = 0; jj < kn; ++jj) o = fmaf(pr[jj], vs[jj * Dv + d], o);
    os[idx] = o;
  }
}

// Channel d (< rot) of one head after rotary embedding. Pairs are (2i, 2i+1)
// when interleaved, else (i, i + rot/2); cos_row/sin_row hold rot/2 values.
// Computed as the CPU does: real = c*x1 - s*x2, imag = s*x1 + c*x2, each
// product rounded on its own (no FMA contraction).
template <typename T>
__device__ __forceinline__ float rope_channel(const T* head, int d, int rot, int interleaved,
                                              const T* cos_row, const T* sin_row,
                                              float cs_scale) {
  int i, d1, d2;
  bool first;
  if (interleaved) {
    i = d >> 1;
    d1 = d & ~1;
    d2 = d1 + 1;
    first = (d & 1) == 0;
  } else {
    const int h = rot >> 1;
    first = d < h;
    i = first ? d : d - h;
    d1 = i;
    d2 = i + h;
  }
  float c = to_f(cos_row[i]);
  float s = to_f(sin_row[i]);
  if (cs_scale != 1.0f) {
    c = __fmul_rn(c, cs_scale);
    s = __fmul_rn(s, cs_scale);
  }
  const float x1 = to_f(head[d1]);
  const float x2 = to_f(head[d2]);
  return first ? __fsub_rn(__fmul_rn(c, x1), __fmul_rn(s, x2))
               : __fadd_rn(__fmul_rn(s, x1), __fmul_rn(c, x2));
}
"""
    + RECORD_SOURCE
)

#: Threads per block for the flat, grid-stride kernels.
FLAT_BLOCK = 256

_sm_counts: dict[int, int] = {}


def sm_count() -> int:
    """Streaming multiprocessors of the current device (read once per device)."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    n = _sm_counts.get(dev)
    if n is None:
        n = int(cupy.cuda.Device(dev).attributes["MultiProcessorCount"])
        _sm_counts[dev] = n
    return n


_capabilities: dict[int, int] = {}


def compute_capability() -> int:
    """The current device's compute capability as major * 10 + minor (read once per device)."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    cc = _capabilities.get(dev)
    if cc is None:
        cc = _capabilities[dev] = int(cupy.cuda.Device(dev).compute_capability)
    return cc


def flat_grid(n: int, sms: int, block: int = FLAT_BLOCK) -> int:
    """Blocks for a grid-stride loop over ``n`` elements: enough to fill the device, no more."""
    return max(1, min(math.ceil(n / block), sms * 16))


def ctype_of(dtype: Any) -> str:
    """The CUDA element type for ``dtype``; a KeyError names only supported ones."""
    try:
        return CTYPE[np.dtype(dtype)]
    except KeyError:
        names = ", ".join(str(d) for d in CTYPE)
        raise KeyError(f"{np.dtype(dtype)} has no CUDA kernel here (supported: {names})") from None


def kernels_by_dtype(
    source: str, names: tuple[str, ...], name_expressions: tuple[str, ...], dtype: Any
) -> dict:
    """``{dtype: {kernel name: function}}`` of ``source``'s templates, compiled now, for
    ``dtype`` or (None: not known yet) both element types."""
    from onnxep.providers_cuda import nvrtc

    dts = tuple(CTYPE) if dtype is None else (np.dtype(dtype),)
    return {
        dt: {n: nvrtc.function(source, f"{n}<{ctype_of(dt)}>", name_expressions) for n in names}
        for dt in dts
    }


def instantiations(names: tuple[str, ...]) -> tuple[str, ...]:
    """Every ``name<type>`` template instantiation for the supported element types."""
    return tuple(f"{n}<{t}>" for n in names for t in CTYPE.values())


# Kernel scalars travel as one struct in device memory, written once per planned shape:
# CuPy converts every scalar argument on every launch (about half a microsecond each),
# a pointer costs next to nothing. The C struct and its NumPy dtype come from one field
# list, 8-byte fields first, so both lay it out without padding.
_FIELD_TYPES = {"i64": ("long long", "<i8"), "i32": ("int", "<i4"), "f32": ("float", "<f4")}


@dataclass(frozen=True)
class ParamStruct:
    """A kernel parameter block: ``fields`` are ``(name, "i64" | "i32" | "f32")``."""

    name: str
    fields: tuple[tuple[str, str], ...]

    @property
    def source(self) -> str:
        body = " ".join(f"{_FIELD_TYPES[t][0]} {n};" for n, t in self.fields)
        return f"struct {self.name} {{ {body} }};\n"

    @property
    def dtype(self) -> np.dtype:
        return np.dtype([(n, _FIELD_TYPES[t][1]) for n, t in self.fields], align=True)

    def to_device(self, xp: Any, **values: Any) -> Any:
        """The block as a device byte array (every field must be given)."""
        if set(values) != {n for n, _ in self.fields}:
            missing = {n for n, _ in self.fields} ^ set(values)
            raise TypeError(f"{self.name}: fields {sorted(missing)} missing or unknown")
        rec = np.zeros((), dtype=self.dtype)
        for k, v in values.items():
            rec[k] = v
        return xp.asarray(np.frombuffer(rec.tobytes(), dtype=np.uint8))


def params(name: str, i64: str = "", i32: str = "", f32: str = "") -> ParamStruct:
    """A :class:`ParamStruct` from space-separated field names per type."""
    fields = [(n, t) for t, names in (("i64", i64), ("i32", i32), ("f32", f32))
              for n in names.split()]  # fmt: skip
    return ParamStruct(name, tuple(fields))
