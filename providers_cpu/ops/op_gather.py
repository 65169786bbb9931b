"""Gather on NumPy: fed indices through ``take``'s own bounds check, and from a strided
view indexing, not ``np.take``.

Fed integer indices (a decoder's token ids into its embedding) took the generic kernel's
range check (min and max through NumPy's Python wrappers) and ``np.take``: 6 us for two
ids. ``x.take(indices, axis)`` in its default ``raise`` mode accepts exactly ONNX's range
(-d .. d-1, negative ones counted from the end) and refuses the rest with IndexError
before writing anything; then the generic kernel runs, for its sentence naming the index.
The same values: both take the same elements.


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
    fed = node.num_inputs > 1 and node.const_input(1) is None

    def run(x, indices):
        if x.flags.c_contiguous:
            if fed and type(indices) is np.ndarray and indices.dtype.kind == "i" and x.ndim:
                try:
                    return (x.take(indices, axis=norm_axis(axis, x.ndim, "Gather")),)
                except IndexError:
                    pass  # out of range: the generic kernel raises, naming the index
            return general(x, indices)
        a = norm_axis(axis, x.ndim, "Gather")
        idx = checked_indices(np, np.asarray(indices), x.shape[a], "Gather", axis=a)
        lead = (slice(None),) * a
        if idx.ndim == 0:
            return (np.array(x[(*lead, int(idx))], order="C"),)
        # advanced indexing picks its own layout for an inner axis (F order here)
        return (np.ascontiguousarray(x[(*lead, idx)]),)

    return run
