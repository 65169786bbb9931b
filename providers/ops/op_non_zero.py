from onnxep.providers.kernel import kernel


@kernel("NonZero", since=9)
def non_zero(node, xp):
    def run(x):
        if x.ndim == 0:
            # a scalar has no coordinates: one column per non-zero, zero rows
            n = int(bool(x))
            return (xp.zeros((0, n), dtype=xp.int64),)
        return (xp.stack(xp.nonzero(x)).astype(xp.int64),)

    return run
