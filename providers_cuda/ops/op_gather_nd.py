"""GatherND on CUDA: one raw launch, index tuples checked on the device.

With ``b`` batch dims, data is viewed as (batches, d_0 .. d_{k-1}, inner)
and indices as (batches, m, k): output row ``(batch, t)`` is the inner slice
the tuple ``indices[batch, t]`` addresses. A thread copies one unit of a
slice (up to 16 bytes where the slice's width and the data's alignment
allow), so every dtype goes through one bit-copying kernel. A tuple with an
entry outside ``[-d_i, d_i - 1]`` gives a zero slice and is recorded in the
provider's error flag; nothing is read back on the host. Tuples longer than
six, index types other than int32/int64 and indices left to check with
nothing to copy run the generic kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops import op_gather_nd as generic
from onnxep.providers.ops.indices import check_nd_shapes

from . import index_cuda as ix
from .reduce_cuda import PlanCache

BODY = (
    ix.COMMON
    + r"""
// out[t, r] = data[t / m, idx[t, 0..k-1], r] in units U; a tuple with a bad entry gives zeros.
template <typename U, typename TI>
__global__ void ix_gather_nd(const U* __restrict__ data, const TI* __restrict__ idx,
                             U* __restrict__ out, int* flag, long long total, long long inner,
                             long long m, long long k, long long d0, long long d1, long long d2,
                             long long d3, long long d4, long long d5, long long first_axis,
                             long long node) {
  const long long d[6] = {d0, d1, d2, d3, d4, d5};
  long long slab = 1;  // tuples' reach: the indexed dims' product
  for (int c = 0; c < 6 && c < k; ++c) slab *= d[c];
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
        if (ok && r == 0) {
          ix_report(flag, node, first_axis + c, v, t * k + c, d[c], total / inner * k);
        }
        ok = false;
      }
      off = off * d[c] + i;
    }
    out[o] = ok ? data[((t / m) * slab + off) * inner + r] : U();
  }
}
"""
)
NAMES = tuple(
    ix.template_name("ix_gather_nd", u, t)
    for u in ix.UNITS.values()
    for t in ix.INDEX_TYPES.values()
)
SIGNATURE = "pppp" + "q" * 12


@kernel("GatherND", since=(11, 12))
def gather_nd(node: NodeInfo, xp: Any):
    fallback = generic.gather_nd(node, xp)
    k = ix.prepare(node, xp)
    if k is None:
        return fallback
    b = int(node.attr("batch_dims", 0)) if node.opset >= 12 else 0
    dev = k.device
    kernels = dev.kernels(BODY, NAMES, SIGNATURE)

    def plan(shape: tuple[int, ...], dtype: np.dtype, ishape: tuple[int, ...], itype: Any):
        ti = ix.INDEX_TYPES.get(np.dtype(itype))
        size = dtype.itemsize
        if ti is None or size not in ix.UNITS:
            return None
        check_nd_shapes("GatherND", shape, ishape, b)
        nk = ishape[-1]
        if nk > ix.MAX_DIMS:
            return None
        tuples = ix.size(ishape[:-1])
        inner = ix.size(shape[b + nk :])
        out_shape = tuple(ishape[:-1]) + tuple(shape[b + nk :])
        if tuples * inner == 0:
            # nothing to copy; indices left to check go to the generic kernel's host check
            return None if tuples * nk else ix.Plan.single(out_shape, None)
        m = ix.size(ishape[b:-1])
        dims = ix.trailing_padded(shape[b : b + nk], 1)
        wide = ix.unit_width(inner * size)

        def launch(width: int, units: int, total: int):
            name = ix.template_name("ix_gather_nd", ix.UNITS[width], ti)
            return name, (total, units, m, nk, *dims, b, k.node_id)

        return ix.unit_plan(k, kernels, out_shape, (wide, size), inner * size, tuples, launch)

    return ix.gather_runner(k, PlanCache(plan), fallback)
