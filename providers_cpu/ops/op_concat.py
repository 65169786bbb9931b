"""Concat on NumPy: ``np.concatenate``, but for blocks at glibc's slow copy distance.

Each input of a concatenation over its outer axes of size one (a batch of one along the
channels: YOLO's C2f and SPPF joins) is one contiguous run of the output, which NumPy
copies with ``memmove``; where a run's destination lay 1-63 bytes after its source modulo
4096, Zen 3 copied it about ten times slower (``block_copy.py``). Those runs are copied
through ``block_copy.copy_run`` instead, the others by NumPy as before; the output is
NumPy's own buffer and its bits ``np.concatenate``'s. Anything else (outer axes past one,
small outputs, mixed dtypes, non-NumPy inputs, an axis or shapes the generic kernel
rejects) takes the generic kernel: its promotion rules and its errors.
"""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.op_concat import concat as generic

from .block_copy import _NEAR, _PAGE, REP_MAX, REP_MIN, copy_run

# dtype kinds whose values are plain bytes (objects and strings keep the generic kernel)
_KINDS = frozenset("biufc")
# the output's allocation (NumPy's: its address is the heap's; tests place it)
_empty = np.empty


@kernel("Concat", since=(1, 4))
def concat(node, xp):
    general = generic(node, xp)
    # Concat-1 defaulted the axis to 1; later versions require it
    axis = node.attr("axis", 1) if node.opset < 4 else node.attr("axis")

    def run(*xs):
        x0 = xs[0]
        # the cheap tests first: most Concats of a model are a few shape integers
        if len(xs) < 2 or x0.__class__ is not np.ndarray or x0.nbytes < REP_MIN:
            return general(*xs)
        nd, dt = x0.ndim, x0.dtype
        ax = axis + nd if axis < 0 else axis
        if not 0 <= ax < nd or dt.kind not in _KINDS or any(d != 1 for d in x0.shape[:ax]):
            return general(*xs)
        tail = x0.shape[ax + 1 :]
        total = 0
        for x in xs:
            if (
                x.__class__ is not np.ndarray
                or x.dtype != dt
                or x.ndim != nd
                or x.shape[:ax] != x0.shape[:ax]
                or x.shape[ax + 1 :] != tail
            ):
                return general(*xs)  # promotion, or the generic kernel's error
            total += x.shape[ax]
        out = _empty((*x0.shape[:ax], total, *tail), dt)
        # each input is one run of the output (outer axes of size one), at byte ``off``
        base = out.ctypes.data
        off = 0
        slow = None
        for i, x in enumerate(xs):
            n = x.nbytes
            if (
                REP_MIN <= n < REP_MAX
                and 0 < (base + off - x.ctypes.data) % _PAGE < _NEAR
                and x.flags.c_contiguous
            ):
                slow = (slow or set()) | {i}
            off += n
        if slow is None:
            np.concatenate(xs, axis=ax, out=out)
            return (out,)
        flat = out.reshape(-1).view(np.uint8)
        off = 0
        for i, x in enumerate(xs):
            n = x.nbytes
            dst = flat[off : off + n].view(dt).reshape(x.shape)
            if i in slow:
                copy_run(dst, x)
            else:
                dst[...] = x
            off += n
        return (out,)

    return run
