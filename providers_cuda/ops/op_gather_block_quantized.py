"""com.microsoft GatherBlockQuantized on CUDA: gather rows of a block-quantized table and
dequantize them in one launch (tied int4 embeddings).

Takes uint8 data: ``8 / bits`` values per byte along the last axis (low bits
first) for bits 2 and 4, which must then be the quantize axis, or one value
per byte for bits 8 with any quantize axis; scales and zero points as the
CPU kernel reads them. An index outside ``[-s, s-1]`` gives a zero slice, as
the operator's schema says and the CPU kernel does: the kernel checks each
index where it reads it, so nothing is read back on the host and the step
can be captured.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops import op_gather_block_quantized as generic

from .quant_cuda import PRELUDE, ctype_of, sm_count

_THREADS = 256

SOURCE = (
    PRELUDE
    + r"""
// out[p, i, s] = (q - zp) * scale of data[p, indices[i], s] (zeros for an index out of range),
// with data's last axis packed BITS to a value; the scale (and zero point) of an element is
// its quantize-axis coordinate divided by block, with every other coordinate kept.
template <typename TI, typename TS, int BITS, typename IX>
__global__ void __launch_bounds__(256) gather_bq(
    const unsigned char* __restrict__ data, const TI* __restrict__ idx,
    const TS* __restrict__ scales, const unsigned char* __restrict__ zp, TS* __restrict__ out,
    IX total, IX inner, IX S, IX Dg, IX DL, IX RB, IX Dq, IX Sq, IX nb, IX block, IX ZL, IX ZRB,
    int has_zp, int default_zp) {
  using namespace oq;
  constexpr unsigned MASK = (1u << BITS) - 1u;
  const IX stride = (IX)gridDim.x * blockDim.x;
  for (IX o = (IX)blockIdx.x * blockDim.x + threadIdx.x; o < total; o += stride) {
    const IX p = o / inner;
    const IX rem = o - p * inner;
    const IX i = rem / S;
    const IX s = rem - i * S;
    long long ix = (long long)idx[i];
    if (ix < 0) ix += Dg;
    if (ix < 0 || ix >= (long long)Dg) {
      out[o] = from_float<TS>(0.f);
      continue;
    }
    const IX e = (p * Dg + (IX)ix) * S + s;  // element of the (unpacked) data
    const IX row = e / DL;
    const IX jl = e - row * DL;
    const unsigned q = ((unsigned)data[row * RB + ((jl * BITS) >> 3)] >> ((jl * BITS) & 7)) & MASK;
    const IX t = e / Sq;
    const IX e_lo = e - t * Sq;
    const IX e_hi = t / Dq;
    const IX jq = t - e_hi * Dq;
    const IX se = (e_hi * nb + jq / block) * Sq + e_lo;  // element of scales / zero points
    int z = default_zp;
    if (has_zp) {
      const IX zrow = se / ZL;
      const IX zj = se - zrow * ZL;
      z = (int)(((unsigned)zp[zrow * ZRB + ((zj * BITS) >> 3)] >> ((zj * BITS) & 7)) & MASK);
    }
    out[o] = from_float<TS>((float)((int)q - z) * to_float<TS>(scales[se]));
  }
}
"""
)


def _fail(why: str) -> NotSupported:
    return NotSupported(f"GatherBlockQuantized: {why}")


def _name(ti: str, ts: str, bits: int, ix: str) -> str:
    return f"gather_bq<{ti}, {ts}, {bits}, {ix}>"


@kernel(
    "GatherBlockQuantized",
    domain="com.microsoft",
    dtypes={0: ("uint8",), 1: ("int32", "int64"), 2: ("float", "float16")},
    capture_safe=True,
)
def gather_block_quantized(node: NodeInfo, xp: Any):
    from onnxep.providers_cuda import nvrtc

    bits, block, gaxis, qaxis = generic.attributes(node)
    rank = node.inputs[0].rank if node.inputs[0] is not None else None
    if rank is not None:
        why = _axes_refusal(gaxis, qaxis, rank, bits)
        if why is not None:
            raise _fail(why)
    known = node.input_dtype(2)
    ts_list = [np.dtype(known)] if known is not None else [np.dtype(np.float32), np.dtype("f2")]
    names = {}
    for ts in ts_list:
        cs = ctype_of(ts, "GatherBlockQuantized: scales")
        for ti, tc in ((np.dtype(np.int32), "int"), (np.dtype(np.int64), "long long")):
            for ix in ("int", "long long"):
                names[(ti, ts, ix)] = _name(tc, cs, bits, ix)
    mod = nvrtc.raw_module(SOURCE, tuple(names.values()))
    fns = {key: mod.get_function(nm) for key, nm in names.items()}
    sms = sm_count()

    def run(data, indices, scales, zero_points=None):
        # Constant tables arrive as the session's device copies, read where they are.
        r = data.ndim
        why = _axes_refusal(gaxis, qaxis, r, bits)
        if why is not None:
            raise ValueError(f"GatherBlockQuantized: {why}")
        g = gaxis + r if gaxis < 0 else gaxis
        q = qaxis + r if qaxis < 0 else qaxis
        per = 8 // bits
        dshape = list(data.shape)
        dshape[-1] *= per  # logical (unpacked) shape
        dq = dshape[q]
        nblk = -(-dq // block)
        if (
            scales.ndim != r
            or any(scales.shape[d] != dshape[d] for d in range(r) if d != q)
            or scales.shape[q] < nblk
        ):
            want = tuple(nblk if d == q else dshape[d] for d in range(r))
            raise ValueError(
                f"GatherBlockQuantized: scales have shape {tuple(scales.shape)}, expected {want}"
            )
        zl, zrb = 1, 1
        if zero_points is not None:
            zl, zrb = scales.shape[-1], zero_points.shape[-1]
            if (
                zero_points.dtype != np.uint8
                or zero_points.shape[:-1] != scales.shape[:-1]
                or zrb * per < zl
            ):
                raise ValueError(
                    f"GatherBlockQuantized: zero_points must be uint8 packed like data with "
                    f"{zl} values per row of shape {tuple(scales.shape[:-1])}, got "
                    f"{zero_points.dtype} {tuple(zero_points.shape)}"
                )
        out_shape = tuple(dshape[:g]) + tuple(indices.shape) + tuple(dshape[g + 1 :])
        out = xp.empty(out_shape, dtype=scales.dtype)
        total = math.prod(out_shape)
        if total == 0:
            return (out,)
        inner = indices.size * math.prod(dshape[g + 1 :])
        big = max(total, data.size * per, scales.size) >= 2**31 - 1
        ix_t, ix = (np.int64, "long long") if big else (np.int32, "int")
        fn = fns.get((np.dtype(indices.dtype), np.dtype(scales.dtype), ix))
        if fn is None:
            raise ValueError(
                f"GatherBlockQuantized: the node was built for scales of type "
                f"{[str(t) for t in ts_list]}, got {scales.dtype}"
            )
        vals = (
            total,
            inner,
            math.prod(dshape[g + 1 :]),
            dshape[g],
            dshape[-1],
            data.shape[-1],
            dq,
            math.prod(dshape[q + 1 :]),
            scales.shape[q],
            block,
            zl,
            zrb,
        )
        default_zp = 1 << (bits - 1)
        blocks = max(1, min(-(-total // _THREADS), sms * 16))
        fn(
            (blocks,),
            (_THREADS,),
            (
                xp.ascontiguousarray(data),
                xp.ascontiguousarray(indices),
                xp.ascontiguousarray(scales),
                data if zero_points is None else xp.ascontiguousarray(zero_points),
                out,
                *(ix_t(v) for v in vals),
                np.int32(zero_points is not None),
                np.int32(default_zp),
            ),
        )
        return (out,)

    return run


def _axes_refusal(gaxis: int, qaxis: int, rank: int, bits: int) -> str | None:
    """Why these axes cannot be run for data of ``rank``, or None."""
    g = gaxis + rank if gaxis < 0 else gaxis
    q = qaxis + rank if qaxis < 0 else qaxis
    if not (0 <= g < rank and 0 <= q < rank):
        return f"gather_axis {gaxis} or quantize_axis {qaxis} out of range for rank {rank}"
    if g == q:
        return "gather_axis and quantize_axis must differ"
    if bits < 8 and q != rank - 1:
        return (
            f"{bits}-bit data packs values along the last axis, so quantize_axis must be the "
            f"last axis ({rank - 1}), got {qaxis}"
        )
    return None
