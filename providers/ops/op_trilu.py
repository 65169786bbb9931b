from onnxep.providers.kernel import kernel

from .shape import scalar_int


@kernel("Trilu", since=14, host_inputs=(1,))
def trilu(node, xp):
    upper = bool(node.attr("upper", 1))

    def run(x, k=None):
        kk = 0 if k is None else scalar_int(k)
        n, m = x.shape[-2], x.shape[-1]
        diag = xp.arange(m).reshape(1, m) - xp.arange(n).reshape(n, 1)
        keep = diag >= kk if upper else diag <= kk
        return (xp.where(keep, x, xp.zeros((), dtype=x.dtype)),)

    return run
