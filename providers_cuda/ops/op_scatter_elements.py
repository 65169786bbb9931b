"""ScatterElements (and the deprecated Scatter) on CUDA: a copy and one raw launch.

The output starts as a device-to-device copy of data (inputs may be shared
constants, never written); then a thread per index writes ``updates[c]`` to
``out[c with c[axis] = indices[c]]``. Reduction ``none`` stores elements as
unsigned integers of their width (every dtype; among duplicates one wins,
which ONNX leaves unspecified); ``add``/``mul``/``max``/``min`` combine
atomically in float32, float16 (computed in float32, rounded per update),
float64, int32 and int64, with NaN winning max and min as in NumPy. An
index outside ``[-d, d-1]`` writes nothing and is recorded in the
provider's error flag; nothing is read back on the host. Other reduction
dtypes, more than six collapsed dims and other index types run the generic
kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops import op_scatter_elements as generic
from onnxep.providers.ops.indices import check_element_shapes
from onnxep.providers.ops.shape import check_reduction, norm_axis

from . import index_cuda as ix
from .reduce_cuda import PlanCache

BODY = (
    ix.COMMON
    + r"""
// out[element o of idx with its axis coordinate replaced by idx[o]] (OP)= upd[o]
template <typename T, typename TI, int OP>
__global__ void ix_scatter_elements(
    T* __restrict__ out, const TI* __restrict__ idx, const T* __restrict__ upd, int* flag,
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
      ix_report(flag, node, axis, v, o, dim, total);
      continue;
    }
    T* p = out + ix_element_offset(o, n, s, ax, i);
    if constexpr (OP == IX_NONE) {
      *p = upd[o];
    } else {
      IxCombine<OP, T>::apply(p, upd[o]);
    }
  }
}
"""
)
SIGNATURE = "pppp" + "q" * 17


ALL_NAMES = ix.all_reduction_names("ix_scatter_elements")


def build_scatter_elements(node: NodeInfo, xp: Any, reduction: str):
    op = node.op_type
    fallback = generic.build_scatter_elements(node, xp, reduction)
    k = ix.prepare(node, xp)
    if k is None:
        return fallback
    axis = int(node.attr("axis", 0))
    dev = k.device
    kernels = dev.kernels(BODY, ix.reduction_names("ix_scatter_elements", reduction), SIGNATURE)
    code = ix.REDUCTION_CODES[reduction]

    def plan(shape, dtype, ishape, itype, ushape, utype) -> ix.Plan | None:
        ti = ix.INDEX_TYPES.get(np.dtype(itype))
        et = ix.element_type(reduction, dtype)
        if ti is None or et is None or utype != dtype or not shape:
            return None
        a = norm_axis(axis, len(shape), op)
        check_element_shapes(op, shape, ishape, a)
        if tuple(ushape) != tuple(ishape):
            raise ValueError(
                f"{op}: updates shape {list(ushape)} must equal indices shape {list(ishape)}"
            )
        total = ix.size(ishape)
        if total == 0:
            return ix.Plan.single(shape, None)
        dims, strides, ax = ix.collapse_elements(ishape, shape, a)
        if len(dims) > ix.MAX_DIMS:
            return None
        name = ix.template_name("ix_scatter_elements", et, ti, code)
        tail = (total, *dims, *strides, ax, shape[a], a, k.node_id)
        return ix.Plan.single(shape, ix.Variant(kernels[name], ix.grid_for(total, dev.sms), tail))

    return ix.scatter_runner(k, PlanCache(plan), fallback)


@kernel("ScatterElements", since=(11, 16))
def scatter_elements(node: NodeInfo, xp: Any):
    reduction = node.attr("reduction", "none") if node.opset >= 16 else "none"
    return build_scatter_elements(node, xp, check_reduction(node.op_type, reduction))


@kernel("Scatter", since=9)
def scatter_old(node: NodeInfo, xp: Any):
    # the deprecated Scatter is ScatterElements without reduction
    return build_scatter_elements(node, xp, "none")
