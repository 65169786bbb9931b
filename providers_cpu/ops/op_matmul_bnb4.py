"""com.microsoft MatMulBnb4: MatMul with B in bitsandbytes' 4-bit FP4 or NF4 blocks.

B is the [N, K] weight flattened row-major, two codes a byte (the even element in the high
nibble), with one ``absmax`` scale per ``block_size`` elements; a code's value is its entry
in the FP4 or NF4 table times its block's absmax; the product is ``A @ B^T``.

``transB=0`` (training's backward layout) is declined: the spec says ``A @ B`` there, and
onnxruntime's CPU kernel computes neither that nor ``A @ B^T`` reshaped, so no result can be
checked against it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument, NotSupported
from onnxep.providers.kernel import kernel

# The formats' 16 values (QLoRA, arXiv 2305.14314): FP4 with a sign bit and bias 3,
# normalized by its largest value 12; NF4 the normal distribution's quantiles.
_FP4 = (
    np.array([0.0, 0.0625, 8, 12, 4, 6, 2, 3, -0.0, -0.0625, -8, -12, -4, -6, -2, -3], np.float64)
    / 12.0
)
_NF4 = np.array(
    [
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    ]
)
_TABLES = {0: _FP4.astype(np.float32), 1: _NF4.astype(np.float32)}


@kernel(
    "MatMulBnb4", since=1, domain="com.microsoft", dtypes={0: ("float", "float16"), 1: ("uint8",)}
)
def matmul_bnb4(node: Any, xp: Any):
    op = node.op_type
    for name in ("K", "N", "block_size", "quant_type"):
        if node.attr(name, None) is None:
            raise NotSupported(f"{op}: the required attribute {name!r} is missing")
    k, n, block = int(node.attr("K")), int(node.attr("N")), int(node.attr("block_size"))
    quant = int(node.attr("quant_type"))
    trans_b = bool(node.attr("transB", 1))
    if not trans_b:
        raise NotSupported(
            f"{op}: transB=0 (the backward-pass layout) is not supported; onnxruntime's CPU "
            "result for it does not follow the spec's A @ dequant(B), so export with transB=1"
        )
    if quant not in _TABLES:
        raise NotSupported(f"{op}: quant_type {quant} is neither 0 (FP4) nor 1 (NF4)")
    if block < 16 or block & (block - 1):
        raise NotSupported(f"{op}: block_size {block} is not a power of 2 of at least 16")
    table = _TABLES[quant]
    numel = n * k

    def dequantize(b, absmax):
        if b.size != (numel + 1) // 2 or absmax.size != (numel + block - 1) // block:
            raise InvalidArgument(
                f"{op}: B must hold {(numel + 1) // 2} bytes and absmax "
                f"{(numel + block - 1) // block} scales for N={n}, K={k}, block_size={block}; "
                f"got {b.size} and {absmax.size}"
            )
        flat = b.reshape(-1)
        codes = np.stack([flat >> 4, flat & 0xF], axis=1).reshape(-1)[:numel]
        scales = np.repeat(absmax.reshape(-1).astype(np.float32), block)[:numel]
        return (table[codes] * scales).reshape(n, k)

    consts = node.const_input(1), node.const_input(2)
    fixed = None if any(c is None for c in consts) else dequantize(*consts)

    def run(a, b, absmax):
        w = fixed if fixed is not None else dequantize(b, absmax)
        y = np.matmul(a.astype(np.float32), w.T)
        return (y.astype(a.dtype, copy=False),)

    return run
