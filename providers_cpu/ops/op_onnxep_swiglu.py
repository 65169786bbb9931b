"""onnxep::SwiGLU on the CPU: SiLU(gate) * up in one compiled pass (float32, numba on).

The nodes it replaces ran the CPU provider's onnxep::SiLU (``jit._logistic``: the gate
times its sigmoid, rounded to float32) and then ``np.multiply``; ``jit._swiglu_rows`` (and
``_swiglu_packed`` on a contiguous packed input) is those two roundings per element, so the
fused node has the unfused nodes' bits. Its gain
is on decode steps, where every node is a few microseconds of dispatch: one call instead
of two, and, where ``fuse_shared_input_matmuls`` packs the gate and up projections into
one MatMul, one product instead of two. float64, numba off, and inputs that broadcast
against each other run the CPU SiLU then ``np.multiply`` (the unfused nodes' calls);
other dtypes take the generic kernel.
"""

from __future__ import annotations

import functools

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.fused import FLOATS
from onnxep.providers.ops.op_onnxep_swiglu import split_packed
from onnxep.providers.ops.op_onnxep_swiglu import swiglu as generic

from .. import jit
from .logistic import logistic

_F32 = np.dtype(np.float32)
_FAST = (_F32, np.dtype(np.float64))


_loops = functools.cache(lambda: (jit.loop("swiglu_rows"), jit.loop("swiglu_packed")))


@kernel("SwiGLU", domain="onnxep", dtypes=FLOATS)
def swiglu(node, xp):
    general = generic(node, xp)

    def run(gate, up=None):
        if gate.dtype not in _FAST or (up is not None and up.dtype != gate.dtype):
            return general(gate, up)
        packed = up is None
        if packed:
            gu = gate
            gate, up = split_packed(gu)
        shape = gate.shape
        if up.shape != shape:  # broadcasting operands: the unfused calls, a fresh product
            return (np.multiply(logistic(gate, mul=True), up),)
        if gate.dtype != _F32 or not jit.ENABLED or not gate.ndim:
            act = logistic(gate, mul=True)
            np.multiply(act, up, out=act)
            return (act,)
        n = shape[-1]
        out = np.empty(shape, _F32)
        rows, joined = _loops()
        if packed and gu.flags.c_contiguous:
            joined(gu.reshape(-1, 2 * n), out.reshape(-1, n))
        else:
            rows(gate.reshape(-1, n), up.reshape(-1, n), out.reshape(-1, n))
        return (out,)

    return run
