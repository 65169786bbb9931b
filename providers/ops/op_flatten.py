import math

from onnxep.providers.kernel import kernel


@kernel("Flatten", since=1)
def flatten(node, xp):
    axis = node.attr("axis", 1)

    def run(x):
        a = axis + x.ndim if axis < 0 else axis
        if not 0 <= a <= x.ndim:
            raise ValueError(f"Flatten: axis {axis} out of range for rank {x.ndim}")
        return (xp.reshape(x, (math.prod(x.shape[:a]), math.prod(x.shape[a:]))),)

    return run
