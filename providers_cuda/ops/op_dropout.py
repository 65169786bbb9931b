"""Dropout: inference mode on the GPU; training mode (a random mask) is declined to the CPU.

The mask comes from NumPy's seeded legacy generator on the CPU provider;
CuPy's generator cannot reproduce it, so a node whose ``training_mode``
is not a constant false is declined rather than run with a different mask.
"""

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_dropout as generic


@kernel("Dropout", since=(1, 6, 7, 10))
def dropout_old(node, xp):
    return generic.dropout_old(node, xp)


@kernel("Dropout", since=(12, 13, 22), host_inputs=(1, 2))
def dropout(node, xp):
    if node.has_input(2):
        mode = node.const_input(2)
        if mode is None or bool(np.asarray(mode).reshape(())):
            raise NotSupported(
                "Dropout: training_mode is not a constant false; training-mode Dropout draws "
                "a random mask that CuPy cannot reproduce from NumPy's seeded generator, so "
                "the CPU provider runs it"
            )
    return generic.dropout(node, xp)
