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

from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops import op_scatter_nd as generic
from onnxep.providers.ops._indices import check_nd_shapes
from onnxep.providers.ops._shape import check_reduction

from . import _index_cuda as ix
from ._reduce_cuda import PlanCache
from .op_gather_nd import nd_tail
from .op_scatter_elements import element_type

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


def names_for(reduction: str) -> tuple[str, ...]:
    """The instantiations a node with ``reduction`` may launch."""
    code = ix.REDUCTION_CODES[reduction]
    types = ix.UNITS.values() if reduction == "none" else ix.REDUCE_TYPES.values()
    return tuple(
        ix.template_name("ix_scatter_nd", t, i, code)
        for t in types
        for i in ix.INDEX_TYPES.values()
    )


ALL_NAMES = tuple(n for r in ix.REDUCTION_CODES for n in names_for(r))


@dataclass(frozen=True)
class ScatterNDPlan:
    """Launches for one input signature: ``wide`` when the updates are aligned to ``width``
    bytes, ``narrow`` otherwise (the same launch for reductions); None: nothing to write."""

    width: int
    wide: ix.Variant | None
    narrow: ix.Variant | None


@kernel("ScatterND", since=(11, 16))
def scatter_nd(node: NodeInfo, xp: Any):
    reduction = node.attr("reduction", "none") if node.opset >= 16 else "none"
    check_reduction("ScatterND", reduction)
    fallback = generic.scatter_nd(node, xp)
    k = ix.prepare(node, xp)
    if k is None:
        return fallback
    dev = k.device
    kernels = dev.kernels(BODY, names_for(reduction), SIGNATURE)
    code = ix.REDUCTION_CODES[reduction]

    def plan(shape, dtype, ishape, itype, ushape, utype) -> ScatterNDPlan | None:
        ti = ix.INDEX_TYPES.get(np.dtype(itype))
        et = element_type(reduction, dtype)
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
            return None if tuples * nk else ScatterNDPlan(1, None, None)
        size = dtype.itemsize
        wide = ix.unit_width(inner * size) if reduction == "none" else size
        variants = []
        for width in (wide, size):
            units = inner * size // width
            t = ix.UNITS[width] if reduction == "none" else et
            name = ix.template_name("ix_scatter_nd", t, ti, code)
            tail = (tuples * units, units, nk, *nd_tail(shape[:nk]), k.node_id)
            variants.append(ix.Variant(kernels[name], ix.grid_for(tuples * units, dev.sms), tail))
        return ScatterNDPlan(wide, *variants)

    plans = PlanCache(plan)
    contiguous, address, empty, stream = dev.contiguous, dev.address, dev.empty, dev.stream
    flag_arg, note_shape = k.flag_arg, k.note_shape

    def run(data: Any, indices: Any, updates: Any) -> tuple:
        p = plans(data.shape, data.dtype, indices.shape, indices.dtype, updates.shape,
                  updates.dtype)  # fmt: skip
        if p is None:
            return fallback(data, indices, updates)
        out = empty(data.shape, data.dtype)
        dev.copy(out, data if contiguous(data) else dev.ascontiguous(data))
        if p.wide is None:
            return (out,)
        if not contiguous(indices):
            indices = dev.ascontiguous(indices)
        if not contiguous(updates):
            updates = dev.ascontiguous(updates)
        v = p.wide if dev.aligned(updates, p.width) else p.narrow
        args = (address(out), address(indices), address(updates), flag_arg, *v.tail)
        v.launch(v.grid, ix.BLOCK, args, stream())
        note_shape(indices.shape)
        return (out,)

    return run
