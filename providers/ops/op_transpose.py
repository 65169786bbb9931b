import numpy as np

from onnxep.providers.kernel import kernel


@kernel("Transpose", since=1)
def transpose(node, xp):
    perm = node.attr("perm", None)
    if xp is np and perm is not None:
        p = tuple(perm)

        def run_np(x):
            # the method: np.transpose's dispatch wrapper costs more than the transpose
            return (x.transpose(p),)

        return run_np

    def run(x):
        p = tuple(perm) if perm is not None else tuple(range(x.ndim - 1, -1, -1))
        return (xp.transpose(x, p),)

    return run
