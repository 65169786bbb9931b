import numpy as np

from onnxep.providers.kernel import kernel


@kernel("Shape", since=(1, 15), host_outputs=(0,))
def shape(node, xp):
    # Python slicing clamps start/end exactly as Shape-15 specifies
    start = node.attr("start", 0) if node.opset >= 15 else 0
    end = node.attr("end", None) if node.opset >= 15 else None

    def run(x):
        return (np.array(x.shape[start:end], dtype=np.int64),)

    return run
