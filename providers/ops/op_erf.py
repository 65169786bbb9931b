from onnxep.providers.kernel import kernel

from . import elementwise as ew


@kernel("Erf", since=(9, 13))
def erf(node, xp):
    def run(x):
        if x.dtype.kind in "iu":
            # Integer inputs (allowed by the schema) compute in float64 and truncate back.
            return (xp.asarray(ew.erf(xp, x.astype(ew.F64))).astype(x.dtype),)
        return (xp.asarray(ew.erf(xp, x)),)

    return run
