import math

import numpy as np

from onnxep.providers.kernel import kernel


@kernel("Size", since=1, host_outputs=(0,))
def size(node, xp):
    def run(x):
        return (np.array(math.prod(x.shape), dtype=np.int64),)

    return run
