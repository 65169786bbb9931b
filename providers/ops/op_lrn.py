"""LRN: local response normalization across channels (axis 1)."""

from onnxep.providers.kernel import kernel

from .reduce import widen


@kernel("LRN", since=(1, 13))
def lrn(node, xp):
    size = int(node.attr("size"))
    alpha = float(node.attr("alpha", 1e-4))
    beta = float(node.attr("beta", 0.75))
    bias = float(node.attr("bias", 1.0))
    before = (size - 1) // 2
    after = size - 1 - before

    def run(x):
        xc = widen(x, xp)
        c = x.shape[1]
        sq = xc * xc
        pad = [(0, 0)] * x.ndim
        pad[1] = (before, after)
        sq = xp.pad(sq, pad)
        # Window sum over channels: `size` shifted slices (size is small).
        acc = sq[:, 0:c]
        for k in range(1, size):
            acc = acc + sq[:, k : k + c]
        y = xc / (bias + (alpha / size) * acc) ** beta
        return (y.astype(x.dtype, copy=False),)

    return run
