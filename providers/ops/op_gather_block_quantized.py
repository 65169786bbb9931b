"""com.microsoft GatherBlockQuantized: Gather rows of a block-quantized table, then dequantize.

onnxruntime-genai's builder emits it for int4 models with tied embeddings.
Rows are gathered while still packed, so only the selected rows are ever
unpacked: the full table (vocabulary x hidden) is never expanded to floats.
``uint8`` data packs ``8 // bits`` values per byte, low bits first, with a
default zero point of ``2**(bits-1)``; ``int4``/``uint4`` data holds one value
per element with default zero points 0 and 8.

Indices lie in ``[-s, s-1]``; unlike ONNX Gather, the operator's schema says
"an out-of-range index produces zeros for the corresponding output slice",
and onnxruntime (CPU) and the CUDA provider do exactly that, so this kernel
does too instead of refusing the index.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .shape import norm_axis


def _unpack(xp: Any, packed: Any, bits: int, axis: int) -> Any:
    """uint8 bytes -> one integer per value along ``axis`` (low bits first)."""
    per = 8 // bits
    p = xp.moveaxis(packed.astype(xp.int32), axis, -1)
    shifts = xp.reshape(xp.arange(per, dtype=xp.int32) * bits, (1,) * p.ndim + (per,))
    vals = (xp.expand_dims(p, -1) >> shifts) & ((1 << bits) - 1)
    vals = xp.reshape(vals, p.shape[:-1] + (p.shape[-1] * per,))
    return xp.moveaxis(vals, -1, axis)


def attributes(node: NodeInfo) -> tuple[int, int, int, int]:
    """``(bits, block_size, gather_axis, quantize_axis)``, refusing what the op does not define."""
    bits = int(node.attr("bits", 4))
    block = int(node.attr("block_size", 128))
    if bits not in (2, 4, 8):
        raise NotSupported(f"GatherBlockQuantized: bits={bits} is not 2, 4 or 8")
    if block < 16 or block & (block - 1):
        raise NotSupported(f"GatherBlockQuantized: block_size {block} is not a power of 2 >= 16")
    return bits, block, int(node.attr("gather_axis", 0)), int(node.attr("quantize_axis", 1))


@kernel(
    "GatherBlockQuantized",
    domain="com.microsoft",
    dtypes={2: ("float", "float16", "bfloat16")},
)
def gather_block_quantized(node: NodeInfo, xp: Any):
    bits, block, gaxis, qaxis = attributes(node)

    def run(data, indices, scales, zero_points=None):
        rank = data.ndim
        g = norm_axis(gaxis, rank, "GatherBlockQuantized")
        q = norm_axis(qaxis, rank, "GatherBlockQuantized")
        if g == q:
            raise ValueError("GatherBlockQuantized: gather_axis and quantize_axis must differ")
        s = data.shape[g]
        flat = xp.reshape(indices, (-1,))
        valid = (flat >= -s) & (flat < s)
        # out-of-range entries read row 0, then their output slices are zeroed
        flat = xp.where(valid, xp.where(flat < 0, flat + s, flat), 0)
        packed = data.dtype == np.uint8
        rows = xp.take(data, flat, axis=g)
        if packed and bits < 8:
            vals = _unpack(xp, rows, bits, q)
        else:
            vals = rows.astype(xp.int32)
        n = vals.shape[q]
        sc = xp.take(scales, flat, axis=g).astype(xp.float32)
        if zero_points is not None:
            zp = xp.take(zero_points, flat, axis=g)
            zp = _unpack(xp, zp, bits, q) if packed and bits < 8 else zp.astype(xp.int32)
            zp = xp.take(zp, xp.arange(sc.shape[q]), axis=q)
        else:
            signed = np.dtype(data.dtype).name == "int4"
            zp = xp.asarray(0 if signed else (1 << (bits - 1)), dtype=xp.int32)
        # One scale (and zero point) per block along the quantized axis.
        blk = xp.arange(n) // block
        sc = xp.take(sc, blk, axis=q)
        if zp.ndim:
            zp = xp.take(zp, blk, axis=q)
        out = (vals - zp).astype(xp.float32) * sc
        out = xp.where(xp.reshape(valid, (-1,) + (1,) * (rank - g - 1)), out, 0)
        # The gathered axis holds all indices flat; give it the indices' shape.
        out = xp.reshape(out, out.shape[:g] + tuple(indices.shape) + out.shape[g + 1 :])
        return (out.astype(scales.dtype),)

    return run
