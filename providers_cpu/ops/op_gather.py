"""Gather on NumPy from a strided view: indexing, not ``np.take``.

``np.take`` first copies a non-contiguous input whole: a CRNN's LSTM unrolled by its
exporter gathers each of 20 time steps from a transposed [20, 2, 4096] view, and each
Gather copied all 655 KB (46 us) to keep 32 KB. Indexing reads the view as it is: a
scalar index is a basic index and one copy of the slice (2.5 us), an index array one
advanced index (8 us for three rows). Both give ``take``'s values in a new C-ordered
array; a contiguous input keeps the generic kernel (``take`` is the faster there).
"""

from __future__ import annotations

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops.indices import checked_indices
from onnxep.providers.ops.op_gather import gather as generic
from onnxep.providers.ops.shape import norm_axis


@kernel("Gather", since=1)
def gather(node, xp):
    general = generic(node, xp)
    axis = node.attr("axis", 0)

    def run(x, indices):
        if x.flags.c_contiguous:
            return general(x, indices)
        a = norm_axis(axis, x.ndim, "Gather")
        idx = checked_indices(np, np.asarray(indices), x.shape[a], "Gather", axis=a)
        lead = (slice(None),) * a
        if idx.ndim == 0:
            return (np.array(x[(*lead, int(idx))], order="C"),)
        # advanced indexing picks its own layout for an inner axis (F order here)
        return (np.ascontiguousarray(x[(*lead, idx)]),)

    return run
