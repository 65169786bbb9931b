from onnxep.providers.kernel import kernel

_NOTE = "the output size depends on the data, read back to the host"


@kernel("NonZero", since=9, capture_safe=False, capture_note=_NOTE)
def non_zero(node, xp):
    def run(x):
        if x.ndim == 0:
            # a scalar has no coordinates: one column per non-zero, zero rows
            n = int(bool(x))
            return (xp.zeros((0, n), dtype=xp.int64),)
        return (xp.stack(xp.nonzero(x)).astype(xp.int64),)

    return run
