"""GRU on CUDA: one cuBLAS input projection and one recurrence launch (``recurrence_cuda``)."""

from onnxep.providers.dtypes import FLOAT_TYPES
from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_gru as generic

from . import recurrence_cuda


@kernel("GRU", since=(1, 3, 7, 14, 22), dtypes=FLOAT_TYPES)
def gru(node, xp):
    return recurrence_cuda.build(node, xp, generic.gru(node, xp), ("Sigmoid", "Tanh"))
