"""ScatterND on CUDA: a copy and one raw launch, index tuples checked on the device.

The output starts as a device-to-device copy of data; then each index
tuple's update slice is written to the slice of the output it addresses.
Reduction ``none`` copies units of up to 16 bytes where the slice's width
and the updates' alignment allow (every dtype; among duplicate tuples one
wins, which ONNX leaves unspecified); ``add``/``mul``/``max``/``min``
combine atomically per element in float32, float16 (computed in float32,
rounded per update), float64, int32 and int64, with NaN winning max and min
as in NumPy. A tuple with an entry outside ``[-d_i, d_i - 1]`` writes
nothing and is recorded in the provider's error flag; nothing is read back
on the host. Other reduction dtypes, tuples longer than six and other index
types run the generic kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops import op_scatter_nd as generic
from onnxep.providers.ops.indices import check_nd_shapes
from onnxep.providers.ops.shape import check_reduction

from . import index_cuda as ix
from .reduce_cuda import PlanCache

BODY = (
    ix.COMMON
    + r"""
// out[idx[t, 0..k-1], r] (OP)= upd[t, r]; a tuple with a bad entry writes nothing.
template <typename T, typename TI, int OP>
__global__ void ix_scatter_nd(T* __restrict__ out, const TI* __restrict__ idx,
                              const T* __restrict__ upd, int* flag, long long total,
                              long long inner, long long k, long long d0, long long d1,
                              long long d2, long long d3, long long d4, long long d5,
                              long long node) {
  const long long d[6] = {d0, d1, d2, d3, d4, d5};
  const long long step = (long long)blockDim.x * gridDim.x;
  for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < total; o += step) {
    const long long t = o / inner;
    const long long r = o - t * inner;
    const TI* tuple = idx + t * k;
    long long off = 0;
    bool ok = true;
    for (int c = 0; c < 6 && c < k; ++c) {
      const long long v = (long long)tuple[c];
      const long long i = ix_norm(v, d[c]);
      if (i < 0) {
        if (ok && r == 0) ix_report(flag, node, c, v, t * k + c, d[c], total / inner * k);
        ok = false;
      }
      off = off * d[c] + i;
    }
    if (!ok) continue;
    T* p = out + off * inner + r;
    if constexpr (OP == IX_NONE) {
      *p = upd[o];
    } else {
      IxCombine<OP, T>::apply(p, upd[o]);
    }
  }
}
"""
)
SIGNATURE = "pppp" + "q" * 10


ALL_NAMES = ix.all_reduction_names("ix_scatter_nd")


@kernel("ScatterND", since=(11, 16))
def scatter_nd(node: NodeInfo, xp: Any):
    reduction = node.attr("reduction", "none") if node.opset >= 16 else "none"
    check_reduction("ScatterND", reduction)
    fallback = generic.scatter_nd(node, xp)
    k = ix.prepare(node, xp)
    if k is None:
        return fallback
    dev = k.device
    kernels = dev.kernels(BODY, ix.reduction_names("ix_scatter_nd", reduction), SIGNATURE)
    code = ix.REDUCTION_CODES[reduction]

    def plan(shape, dtype, ishape, itype, ushape, utype) -> ix.Plan | None:
        ti = ix.INDEX_TYPES.get(np.dtype(itype))
        et = ix.element_type(reduction, dtype)
        if ti is None or et is None or utype != dtype:
            return None
        check_nd_shapes("ScatterND", shape, ishape)
        nk = ishape[-1]
        want = (*ishape[:-1], *shape[nk:])
        if tuple(ushape) != want:
            raise ValueError(
                f"ScatterND: updates shape {list(ushape)} must be indices.shape[:-1] + "
                f"data.shape[{nk}:] = {list(want)}"
            )
        if nk > ix.MAX_DIMS:
            return None
        tuples, inner = ix.size(ishape[:-1]), ix.size(shape[nk:])
        if tuples * inner == 0:
            # nothing to write; indices left to check go to the generic kernel's host check
            return None if tuples * nk else ix.Plan.single(shape, None)
        size = dtype.itemsize
        wide = ix.unit_width(inner * size) if reduction == "none" else size
        dims = ix.trailing_padded(shape[:nk], 1)

        def launch(width: int, units: int, total: int):
            t = ix.UNITS[width] if reduction == "none" else et
            name = ix.template_name("ix_scatter_nd", t, ti, code)
            return name, (total, units, nk, *dims, k.node_id)

        return ix.unit_plan(k, kernels, shape, (wide, size), inner * size, tuples, launch)

    return ix.scatter_runner(k, PlanCache(plan), fallback)
