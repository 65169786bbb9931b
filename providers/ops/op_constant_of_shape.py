import numpy as np

from onnxep.providers.kernel import kernel

from .shape import ints


@kernel("ConstantOfShape", since=9, host_inputs=(0,))
def constant_of_shape(node, xp):
    value = node.attr("value", None)
    value = np.zeros(1, np.float32) if value is None else np.asarray(value)
    dtype = value.dtype
    fill = value.reshape(-1)[0]

    def run(shape):
        return (xp.full(tuple(ints(shape)), fill, dtype=dtype),)

    return run
