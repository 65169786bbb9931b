from typing import Any

from onnxep.providers.kernel import kernel

from .shape import ints, norm_axes, onnx_slice

#: index tuples a Slice node with fed bounds remembers (emptied when full)
MEMO_KEYS = 64


def _slice(x, starts, ends, axes, steps):
    return x[_index(x, starts, ends, axes, steps)]


def _index(x, starts, ends, axes, steps):
    if axes is None:
        axes = list(range(len(starts)))
    axes = norm_axes(axes, x.ndim, "Slice")
    if steps is None:
        steps = [1] * len(starts)
    index = [slice(None)] * x.ndim
    for a, s, e, st in zip(axes, starts, ends, steps):
        index[a] = onnx_slice(s, e, st, x.shape[a])
    return tuple(index)


@kernel("Slice", since=1)
def slice_attr(node, xp):
    starts = [int(v) for v in node.attr("starts")]
    ends = [int(v) for v in node.attr("ends")]
    axes = node.attr("axes", None)

    def run(x):
        return (_slice(x, starts, ends, axes, None),)

    return run


@kernel("Slice", since=10, host_inputs=(1, 2, 3, 4))
def slice_(node, xp):
    consts = [node.const_input(i) for i in range(1, 5)]
    if (
        consts[0] is not None
        and consts[1] is not None
        and all(consts[i] is not None or not node.has_input(i + 1) for i in (2, 3))
    ):
        # Constant bounds (the usual case in exported models): the index tuple
        # depends only on the input's shape, so it is worked out once per shape.
        args = [None if c is None else ints(c) for c in consts]
        memo: dict[tuple, tuple] = {}

        def run_const(x, *_):
            index = memo.get(x.shape)
            if index is None:
                index = _index(x, *args)
                if len(memo) < 64:
                    memo[x.shape] = index
            return (x[index],)

        return run_const

    # Bounds computed in the graph (a decoder's Shape -> Gather -> Slice, a step counter)
    # repeat from run to run: the index tuple is remembered per input shape and the
    # bounds' bytes, which cost a fraction of recomputing it (3 us a node, ints() and
    # the clamping in Python).
    memo_fed: dict[tuple, tuple] = {}

    def run(x, starts, ends, axes=None, steps=None):
        key = _key(x, starts, ends, axes, steps)
        index = None if key is None else memo_fed.get(key)
        if index is None:
            index = _index(
                x,
                ints(starts),
                ints(ends),
                None if axes is None else ints(axes),
                None if steps is None else ints(steps),
            )
            if key is not None:
                if len(memo_fed) >= MEMO_KEYS:
                    memo_fed.clear()
                memo_fed[key] = index
        return (x[index],)

    return run


def _key(x: Any, starts: Any, ends: Any, axes: Any, steps: Any) -> tuple | None:
    """The memo key of one Slice: the input's shape and each bound's type and bytes
    (int32 [1, 0] and int64 [1] have the same bytes), or None for bounds that are not
    NumPy arrays or scalars."""
    try:
        return (
            x.shape,
            starts.dtype.char,
            starts.tobytes(),
            ends.dtype.char,
            ends.tobytes(),
            None if axes is None else (axes.dtype.char, axes.tobytes()),
            None if steps is None else (steps.dtype.char, steps.tobytes()),
        )
    except AttributeError:
        return None
