"""Compress: the slices along an axis (or elements of the flattened input) where condition holds.

A condition shorter than the axis leaves the rest out, as the spec says. A
longer one may only carry False past the end: Compress "behaves like
numpy.compress", which refuses a True that selects a slice that does not
exist, and dropping it silently would hide the mistake.
"""

from onnxep.providers.kernel import kernel

from .shape import norm_axis

_NOTE = "the output size depends on the data, read back to the host"


@kernel("Compress", since=9, capture_safe=False, capture_note=_NOTE)
def compress(node, xp):
    axis = node.attr("axis", None)

    def run(x, condition):
        if axis is None:
            x = xp.reshape(x, (-1,))
            a = 0
        else:
            a = norm_axis(axis, x.ndim, "Compress")
        n = x.shape[a]
        cond = xp.reshape(condition, (-1,))
        (idx,) = xp.nonzero(cond)
        # nonzero already read the count back; the last position costs one more read
        if idx.shape[0] and int(idx[-1]) >= n:
            past = idx[idx >= n]
            where = "the flattened input" if axis is None else f"axis {a}"
            more = f" ({past.shape[0]} True entries past the end)" if past.shape[0] > 1 else ""
            raise IndexError(
                f"Compress: condition is True at position {int(past[0])} but {where} has only "
                f"{n} entries{more}; a condition longer than that must be False past the end"
            )
        return (xp.take(x, idx, axis=a),)

    return run
