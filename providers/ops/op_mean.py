import functools

from onnxep.providers.kernel import kernel

from .elementwise import F32, NARROW_FLOATS


@kernel("Mean", since=(1, 6, 8, 13))
def mean(node, xp):
    def run(*xs):
        if len(xs) == 1:
            return (xs[0],)
        dt = xs[0].dtype
        work = [x.astype(F32) for x in xs] if dt in NARROW_FLOATS else xs
        s = functools.reduce(xp.add, work)
        return (xp.asarray(s / len(xs)).astype(dt),)

    return run
