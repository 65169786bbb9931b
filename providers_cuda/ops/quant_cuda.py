"""What the quantized-weight kernels share: CUDA C helpers and the device facts geometry needs.

MatMulNBits and GatherBlockQuantized compile their CUDA C (a string beside
the Python that launches it) with :data:`PRELUDE` in front. CuPy is imported
inside functions only, so these modules import on machines without it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .attention_cuda import sm_count  # noqa: F401 - the quantized ops' geometry reads it here

#: Element types the quantized kernels read and write, by NumPy dtype.
CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float16): "__half"}

PRELUDE = r"""
#include <cuda_fp16.h>

namespace oq {

template <typename T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}

// 2^23 + v as a float, for a byte v: the integer lands in the mantissa, so
// subtracting 2^23 + zero_point afterwards gives v - zero_point exactly, with
// one byte permute instead of an integer-to-float conversion.
template <int B>
__device__ __forceinline__ float byte_magic(unsigned bytes) {
  return __uint_as_float(__byte_perm(bytes, 0x4B000000u, 0x7440u | B));
}

// The 32 / BITS unsigned values of one packed 32-bit word (low bits first),
// each minus ``off`` (2^23 + zero point): d[i] = q_i - zero_point exactly.
template <int BITS>
__device__ __forceinline__ void unpack_word(unsigned w, float off, float (&d)[32 / BITS]) {
  constexpr int PER = 8 / BITS;
  constexpr unsigned MASK = ((1u << BITS) - 1u) * 0x01010101u;
#pragma unroll
  for (int t = 0; t < PER; ++t) {
    const unsigned part = (w >> (BITS * t)) & MASK;
    d[0 * PER + t] = byte_magic<0>(part) - off;
    d[1 * PER + t] = byte_magic<1>(part) - off;
    d[2 * PER + t] = byte_magic<2>(part) - off;
    d[3 * PER + t] = byte_magic<3>(part) - off;
  }
}

}  // namespace oq
"""


def ctype_of(dtype: Any, what: str) -> str:
    """The CUDA type of ``dtype``; the error names ``what`` and the supported types."""
    try:
        return CTYPE[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise ValueError(f"{what}: {dtype} is not float32 or float16") from None


def pow2_ceil(x: int) -> int:
    return 1 << max(0, (int(x) - 1).bit_length())
