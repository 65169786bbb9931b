from onnxep.providers.dtypes import np_dtype
from onnxep.providers.kernel import kernel


@kernel("EyeLike", since=9)
def eye_like(node, xp):
    k = node.attr("k", 0)
    elem = node.attr("dtype", None)
    dtype = None if elem is None else np_dtype(int(elem))

    def run(x):
        if x.ndim != 2:
            raise ValueError(f"EyeLike: input must be 2-D, got rank {x.ndim}")
        n, m = x.shape
        return (xp.eye(n, m, k=k, dtype=dtype or x.dtype),)

    return run
