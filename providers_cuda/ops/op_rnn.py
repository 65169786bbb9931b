"""RNN on CUDA: one cuBLAS input projection and one recurrence launch (``recurrence_cuda``)."""

from onnxep.providers.dtypes import FLOAT_TYPES
from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_rnn as generic

from . import recurrence_cuda


@kernel("RNN", since=(1, 7, 14, 22), dtypes=FLOAT_TYPES)
def rnn(node, xp):
    return recurrence_cuda.build(node, xp, generic.rnn(node, xp), ("Tanh",))
