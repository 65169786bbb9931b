"""Gather on CUDA: one raw launch, indices checked on the device (an embedding lookup's op).

``out[p, j, r] = data[p, indices[j], r]`` over data viewed as (outer, dim,
inner) around the axis. A thread copies one unit of a row -- up to 16 bytes
where the row's width and the data's alignment allow -- so every dtype
gathers through the same bit-copying kernel. A negative index counts from
the end; one outside ``[-dim, dim-1]`` gives a zero row and is recorded in
the provider's error flag (raised at the run's next read of its results),
so nothing is read back on the host and the step can be captured.
Everything else (rank-0 data, index types other than int32/int64, empty
data with indices to check) runs the generic kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops import op_gather as generic
from onnxep.providers.ops.shape import norm_axis

from . import index_cuda as ix
from .reduce_cuda import PlanCache

BODY = (
    ix.COMMON
    + r"""
// out[p, j, r] = data[p, idx[j], r] in units U; a bad index gives a zero row.
template <typename U, typename TI>
__global__ void ix_gather(const U* __restrict__ data, const TI* __restrict__ idx,
                          U* __restrict__ out, int* flag, long long total, long long inner,
                          long long n, long long dim, long long axis, long long node) {
  const long long step = (long long)blockDim.x * gridDim.x;
  for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < total; o += step) {
    const long long t = o / inner;
    const long long r = o - t * inner;
    const long long p = t / n;
    const long long j = t - p * n;
    const long long v = (long long)idx[j];
    const long long i = ix_norm(v, dim);
    if (i < 0) {
      out[o] = U();
      if (p == 0 && r == 0) ix_report(flag, node, axis, v, j, dim, n);
      continue;
    }
    out[o] = data[(p * dim + i) * inner + r];
  }
}
"""
)
NAMES = tuple(
    ix.template_name("ix_gather", u, t) for u in ix.UNITS.values() for t in ix.INDEX_TYPES.values()
)
SIGNATURE = "pppp" + "q" * 6


@kernel("Gather", since=1)
def gather(node: NodeInfo, xp: Any):
    fallback = generic.gather(node, xp)
    k = ix.prepare(node, xp)
    if k is None:
        return fallback
    axis = int(node.attr("axis", 0))
    dev = k.device
    kernels = dev.kernels(BODY, NAMES, SIGNATURE)

    def plan(shape: tuple[int, ...], dtype: np.dtype, ishape: tuple[int, ...], itype: Any):
        ti = ix.INDEX_TYPES.get(np.dtype(itype))
        size = dtype.itemsize
        if ti is None or not shape or size not in ix.UNITS:
            return None
        a = norm_axis(axis, len(shape), "Gather")
        dim, outer, inner = shape[a], ix.size(shape[:a]), ix.size(shape[a + 1 :])
        n = ix.size(ishape)
        out_shape = shape[:a] + tuple(ishape) + shape[a + 1 :]
        if outer * n * inner == 0:
            # nothing to copy; indices left to check go to the generic kernel's host check
            return None if n else ix.Plan.single(out_shape, None)
        wide = ix.unit_width(inner * size)

        def launch(width: int, units: int, total: int):
            name = ix.template_name("ix_gather", ix.UNITS[width], ti)
            return name, (total, units, n, dim, a, k.node_id)

        return ix.unit_plan(k, kernels, out_shape, (wide, size), inner * size, outer * n, launch)

    return ix.gather_runner(k, PlanCache(plan), fallback)
