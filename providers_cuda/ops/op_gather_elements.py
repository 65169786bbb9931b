"""GatherElements on CUDA: one raw launch, indices checked on the device.

``out[c] = data[c with c[axis] = indices[c]]`` for every coordinate ``c`` of
indices, which may be shorter than data off the axis. Index and data
coordinates are collapsed to at most six dims (``index_cuda.collapse_elements``);
elements are copied as unsigned integers of their width, so every dtype
goes through one kernel. An index outside ``[-d, d-1]`` gives a zero and is
recorded in the provider's error flag; nothing is read back on the host.
More than six collapsed dims and index types other than int32/int64 run
the generic kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops import op_gather_elements as generic
from onnxep.providers.ops.indices import check_element_shapes
from onnxep.providers.ops.shape import norm_axis

from . import index_cuda as ix
from .reduce_cuda import PlanCache

BODY = (
    ix.COMMON
    + r"""
// out[o] = data[element o of idx with its axis coordinate replaced by idx[o]]
template <typename U, typename TI>
__global__ void ix_gather_elements(
    const U* __restrict__ data, const TI* __restrict__ idx, U* __restrict__ out, int* flag,
    long long total, long long n0, long long n1, long long n2, long long n3, long long n4,
    long long n5, long long s0, long long s1, long long s2, long long s3, long long s4,
    long long s5, long long ax, long long dim, long long axis, long long node) {
  const long long n[6] = {n0, n1, n2, n3, n4, n5};
  const long long s[6] = {s0, s1, s2, s3, s4, s5};
  const long long step = (long long)blockDim.x * gridDim.x;
  for (long long o = (long long)blockIdx.x * blockDim.x + threadIdx.x; o < total; o += step) {
    const long long v = (long long)idx[o];
    const long long i = ix_norm(v, dim);
    if (i < 0) {
      out[o] = U();
      ix_report(flag, node, axis, v, o, dim, total);
      continue;
    }
    out[o] = data[ix_element_offset(o, n, s, ax, i)];
  }
}
"""
)
NAMES = tuple(
    ix.template_name("ix_gather_elements", u, t)
    for u in ix.UNITS.values()
    for t in ix.INDEX_TYPES.values()
)
SIGNATURE = "pppp" + "q" * 17


@kernel("GatherElements", since=11)
def gather_elements(node: NodeInfo, xp: Any):
    fallback = generic.gather_elements(node, xp)
    k = ix.prepare(node, xp)
    if k is None:
        return fallback
    axis = int(node.attr("axis", 0))
    dev = k.device
    kernels = dev.kernels(BODY, NAMES, SIGNATURE)

    def plan(shape: tuple[int, ...], dtype: np.dtype, ishape: tuple[int, ...], itype: Any):
        ti = ix.INDEX_TYPES.get(np.dtype(itype))
        if ti is None or not shape or dtype.itemsize not in ix.UNITS:
            return None
        a = norm_axis(axis, len(shape), "GatherElements")
        check_element_shapes("GatherElements", shape, ishape, a)
        total = ix.size(ishape)
        if total == 0:
            return ix.Plan.single(ishape, None)
        dims, strides, ax = ix.collapse_elements(ishape, shape, a)
        if len(dims) > ix.MAX_DIMS:
            return None
        name = ix.template_name("ix_gather_elements", ix.UNITS[dtype.itemsize], ti)
        tail = (total, *dims, *strides, ax, shape[a], a, k.node_id)
        return ix.Plan.single(ishape, ix.Variant(kernels[name], ix.grid_for(total, dev.sms), tail))

    return ix.gather_runner(k, PlanCache(plan), fallback)
