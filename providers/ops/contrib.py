"""Shared math for the com.microsoft LLM contrib kernels (norms, GELUs, MatMulNBits...).

Everything here is written against the array namespace ``xp`` (NumPy or CuPy).
Half-precision inputs are computed in float32, as onnxruntime does, and cast
back at the end; float64 stays float64.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from onnxep.errors import NotSupported

from .indices import checked_indices

_HALF_NAMES = ("float16", "bfloat16")


def is_numpy(xp: Any) -> bool:
    return getattr(xp, "__name__", "") == "numpy"


def compute_dtype(dtype: Any) -> Any:
    """float64 stays float64; every other float type is computed in float32."""
    return np.float64 if np.dtype(dtype) == np.float64 else np.float32


def up(x: Any, xp: Any, dtype: Any = None) -> Any:
    """``x`` in its compute dtype (or ``dtype``), without a copy when it already is."""
    dt = compute_dtype(x.dtype) if dtype is None else dtype
    return x if x.dtype == dt else x.astype(dt)


def down(x: Any, dtype: Any) -> Any:
    return x if x.dtype == dtype else x.astype(dtype)


def out_dtype(node: Any, j: int, fallback: Any) -> Any:
    """The declared dtype of output ``j``, else ``fallback``."""
    v = node.outputs[j] if j < len(node.outputs) else None
    if v is not None and v.dtype is not None:
        return v.dtype
    return fallback


def pad_outputs(node: Any, values: dict[int, Any]) -> tuple:
    """A tuple with one entry per node output, ``None`` where nothing was computed."""
    return tuple(values.get(j) for j in range(max(node.num_outputs, 1)))


# ---------------------------------------------------------------- activations


def sigmoid(x: Any, xp: Any) -> Any:
    # exp(-|x|) never overflows, so both branches are finite.
    e = xp.exp(-xp.abs(x))
    one = xp.ones((), dtype=x.dtype)
    return xp.where(x >= 0, one / (one + e), e / (one + e))


def silu(x: Any, xp: Any) -> Any:
    return x * sigmoid(x, xp)


def softplus(x: Any, xp: Any) -> Any:
    return xp.maximum(x, 0) + xp.log1p(xp.exp(-xp.abs(x)))


def _erfc_nonneg_f32(z: Any, xp: Any) -> Any:
    """erfc(z) for z >= 0 with fractional error below 1.2e-7 (Chebyshev fit, Numerical Recipes)."""
    t = 1.0 / (1.0 + 0.5 * z)
    coeffs = (
        -1.26551223,
        1.00002368,
        0.37409196,
        0.09678418,
        -0.18628806,
        0.27886807,
        -1.13520398,
        1.48851587,
        -0.82215223,
        0.17087277,
    )
    poly = xp.full(z.shape, coeffs[-1], dtype=z.dtype)
    for c in reversed(coeffs[:-1]):
        poly = c + t * poly
    return t * xp.exp(-z * z + poly)


def _erfc_nonneg_f64(z: Any, xp: Any) -> Any:
    """erfc(z) for z >= 0 to double precision.

    Below 2.5 the Maclaurin-type series erf(z) = 2/sqrt(pi) e^{-z^2} sum 2^n z^{2n+1}/(2n+1)!!
    (all terms positive, no cancellation); above it the Laplace continued fraction
    evaluated backwards, which converges fast there.
    """
    small = xp.minimum(z, 2.5)
    z2 = small * small
    term = small.copy()
    total = small.copy()
    for n in range(1, 60):
        term = term * (2.0 * z2) / (2 * n + 1)
        total = total + term
    erf_small = (2.0 / math.sqrt(math.pi)) * xp.exp(-z2) * total
    big = xp.maximum(z, 2.5)
    f = big.copy()
    for k in range(60, 0, -1):
        f = big + (k / 2.0) / f
    erfc_big = xp.exp(-big * big) / (math.sqrt(math.pi) * f)
    return xp.where(z < 2.5, 1.0 - erf_small, erfc_big)


def erfc(x: Any, xp: Any) -> Any:
    z = xp.abs(x)
    r = _erfc_nonneg_f64(z, xp) if x.dtype == np.float64 else _erfc_nonneg_f32(z, xp)
    return xp.where(x >= 0, r, 2.0 - r).astype(x.dtype)


def gelu_erf(x: Any, xp: Any) -> Any:
    """x * Phi(x); written with erfc(-x/sqrt2) so the negative tail keeps its precision."""
    return (0.5 * x * erfc(-x * (1.0 / math.sqrt(2.0)), xp)).astype(x.dtype)


def gelu_tanh(x: Any, xp: Any) -> Any:
    c = math.sqrt(2.0 / math.pi)
    return (0.5 * x * (1.0 + xp.tanh(c * (x + 0.044715 * (x * x * x))))).astype(x.dtype)


# ---------------------------------------------------------------- norms


def rms_norm(x: Any, axes: tuple[int, ...], eps: float, xp: Any) -> tuple[Any, Any]:
    """(x * inv_rms, inv_rms) over ``axes``, in x's dtype (already the compute dtype)."""
    ms = xp.mean(x * x, axis=axes, keepdims=True)
    inv = 1.0 / xp.sqrt(ms + eps)
    return x * inv, inv


# ---------------------------------------------------------------- matmul


def matmul(a: Any, b: Any, xp: Any) -> Any:
    """a @ b accumulated in at least float32.

    NumPy has no BLAS for half types, so they go through float32; other
    libraries (cuBLAS) accumulate half products in float32 themselves.
    """
    if a.dtype != b.dtype:
        dt = np.promote_types(compute_dtype(a.dtype), compute_dtype(b.dtype))
        return xp.matmul(up(a, xp, dt), up(b, xp, dt))
    if np.dtype(a.dtype).name in _HALF_NAMES and (is_numpy(xp) or a.dtype.name == "bfloat16"):
        return xp.matmul(up(a, xp), up(b, xp))
    return xp.matmul(a, b)


# ---------------------------------------------------------------- n-bit weights


def unpack_bits(packed: Any, bits: int, xp: Any) -> Any:
    """uint8 (..., n) -> uint8 (..., n * 8 // bits), low-order bits first within each byte."""
    per = 8 // bits
    if per == 1:
        return packed
    shifts = xp.arange(0, 8, bits, dtype=np.uint8)
    vals = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return vals.reshape(packed.shape[:-1] + (packed.shape[-1] * per,))


def dequantize_nbits(
    b: Any,
    scales: Any,
    zero_points: Any,
    g_idx: Any,
    *,
    n: int,
    k: int,
    bits: int,
    block_size: int,
    dtype: Any,
    xp: Any,
) -> Any:
    """The (N, K) float matrix that MatMulNBits' packed weight, scales and zero points encode.

    Arithmetic is float32 (scale and float zero points are upcast first);
    the result is cast to ``dtype``.
    """
    k_blocks = -(-k // block_size)
    q = unpack_bits(b.reshape(n, k_blocks, -1), bits, xp)  # (N, k_blocks, block_size)
    s = up(scales.reshape(n, -1)[:, :k_blocks], xp, np.float32)
    if zero_points is None:
        zp = None
    elif zero_points.dtype == np.uint8:
        zp = unpack_bits(zero_points.reshape(n, -1), bits, xp)[:, :k_blocks].astype(np.float32)
    else:
        zp = up(zero_points.reshape(n, -1)[:, :k_blocks], xp, np.float32)
    if g_idx is None:
        # Scales and zero points broadcast over each block; the padding past K is cropped.
        if zp is None:
            zp = float(1 << (bits - 1))
        else:
            zp = zp[:, :, None]
        w = q.astype(np.float32)
        w -= zp  # in place: this matrix is as large as the whole weight
        w *= s[:, :, None]
        w = w.reshape(n, k_blocks * block_size)
        if k != w.shape[1]:
            w = xp.ascontiguousarray(w[:, :k])  # drop the last block's padding
        return down(w, dtype)
    # g_idx names each k's quantization group, so scales/zero points are gathered per column.
    gi = g_idx.reshape(-1)[:k].astype(np.int64)
    if gi.shape[0] != k:
        raise ValueError(f"MatMulNBits: g_idx has {gi.shape[0]} entries, expected K={k}")
    # a group past the scales would read another column's scale (or wrap, if negative)
    gi = checked_indices(xp, gi, k_blocks, "MatMulNBits", name="g_idx", negative=False,
                         extent=f"the {k_blocks} quantization groups of K")  # fmt: skip
    q = q.reshape(n, k_blocks * block_size)[:, :k].astype(np.float32)
    zp_full = float(1 << (bits - 1)) if zp is None else xp.take(zp, gi, axis=1)
    w = (q - zp_full) * xp.take(s, gi, axis=1)
    return down(w, dtype)


def int8_blocks(a: Any, block: int, xp: Any) -> Any:
    """A rounded as int8 per block of K (symmetric, round half to even), back in float32."""
    af = a.astype(xp.float32)
    k = af.shape[-1]
    pad = (-k) % block
    if pad:
        af = xp.concat([af, xp.zeros(af.shape[:-1] + (pad,), dtype=xp.float32)], axis=-1)
    blocks = xp.reshape(af, af.shape[:-1] + ((k + pad) // block, block))
    amax = xp.max(xp.abs(blocks), axis=-1, keepdims=True)
    scale = amax / xp.float32(127.0)
    # An all-zero block rounds to zeros whatever its inverse scale; 1 avoids 0 * inf.
    inv = xp.float32(127.0) / xp.where(amax == 0, xp.float32(1.0), amax)
    q = xp.round(blocks * inv)
    q *= scale
    out = xp.reshape(q, af.shape)
    return out[..., :k] if pad else out


def check_nbits(bits: int, block_size: int, op: str) -> None:
    if bits not in (2, 3, 4, 5, 6, 7, 8):
        raise NotSupported(f"{op}: bits={bits} is not supported (2..8)")
    if bits not in (2, 4, 8):
        # Odd widths would straddle byte boundaries; no exporter emits them.
        raise NotSupported(f"{op}: bits={bits} is not supported; use 2, 4 or 8")
    if block_size < 16 or block_size & (block_size - 1):
        raise NotSupported(f"{op}: block_size={block_size} must be a power of two >= 16")


def nbits_attrs(node: Any) -> tuple[int, int, int, int, bool]:
    """MatMulNBits' ``(K, N, bits, block_size, int8_a)``, checked; ``int8_a``: A is rounded
    to int8 per block of K (accuracy_level 4 with 4- or 8-bit weights), as onnxruntime's CPU
    kernel does; reproducing that rounding keeps results (and greedy decodes) identical to
    onnxruntime's on models exported for it."""
    k = int(node.attr("K"))
    n = int(node.attr("N"))
    bits = int(node.attr("bits", 4))
    block_size = int(node.attr("block_size"))
    check_nbits(bits, block_size, "MatMulNBits")
    if int(node.attr("weight_prepacked", 0)) != 0:
        raise NotSupported(
            "MatMulNBits: weight_prepacked != 0 (a CUDA-specific layout) is not supported"
        )
    int8_a = int(node.attr("accuracy_level", 0)) == 4 and bits in (4, 8)
    return k, n, bits, block_size, int8_a


def nbits_constants(node: Any) -> list | None:
    """MatMulNBits' B, scales, zero points and g_idx as the model's constants (None for an
    omitted optional one), or None where B, the scales or a given optional input is not
    constant."""
    consts = [node.const_input(i) for i in range(1, 5)]
    if consts[0] is None or consts[1] is None:
        return None
    if any(consts[i] is None and node.has_input(i + 1) for i in (2, 3)):
        return None
    return consts


def skip_norm_builder(node: Any, xp: Any, simplified: bool):
    """The run callable shared by SkipLayerNormalization and SkipSimplifiedLayerNormalization.

    Inputs: input, skip, gamma, then beta (non-simplified only) and bias.
    Outputs: output, mean, inv_std_var, input_skip_bias_sum.
    """
    eps = float(node.attr("epsilon", 1e-12))
    beta_idx, bias_idx = (None, 3) if simplified else (3, 4)
    want = [node.has_output(j) for j in range(4)]
    stat_dtype = [out_dtype(node, j, np.float32) for j in (1, 2)]

    def run(x, skip, gamma, *rest):
        def opt(i):
            j = None if i is None else i - 3
            return rest[j] if j is not None and j < len(rest) else None

        beta, bias = opt(beta_idx), opt(bias_idx)
        cdt = compute_dtype(x.dtype)
        s = up(x, xp, cdt) + up(skip, xp, cdt)
        if bias is not None:
            s = s + up(bias, xp, cdt)
        mean = xp.mean(s, axis=-1, keepdims=True)
        if simplified:
            inv = 1.0 / xp.sqrt(xp.mean(s * s, axis=-1, keepdims=True) + eps)
            y = s * inv * up(gamma, xp, cdt)
        else:
            c = s - mean
            inv = 1.0 / xp.sqrt(xp.mean(c * c, axis=-1, keepdims=True) + eps)
            y = c * inv * up(gamma, xp, cdt)
            if beta is not None:
                y = y + up(beta, xp, cdt)
        outs = {0: down(y, x.dtype)}
        if want[1]:
            # RMSNorm subtracts no mean; onnxruntime reports zeros there.
            outs[1] = down(xp.zeros_like(mean) if simplified else mean, stat_dtype[0])
        if want[2]:
            outs[2] = down(inv, stat_dtype[1])
        if want[3]:
            outs[3] = down(s, x.dtype)
        return pad_outputs(node, outs)

    return run
