import numpy as np

from onnxep.providers.kernel import kernel

from .shape import ints


@kernel("Expand", since=8, host_inputs=(1,))
def expand(node, xp):
    def run(x, shape):
        # bidirectional: a 1 in `shape` keeps the input's dim
        out_shape = np.broadcast_shapes(tuple(x.shape), tuple(ints(shape)))
        return (xp.broadcast_to(x, out_shape).copy(),)

    return run
