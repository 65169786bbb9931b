from onnxep.providers.kernel import kernel

from .shape import ints, norm_axis, slice_along


def _parts(dim: int, split: list[int] | None, n: int, num_outputs: int | None) -> list[int]:
    if split:
        if sum(split) != dim:
            raise ValueError(f"Split: sizes {split} do not add up to {dim}")
        return split
    if num_outputs is not None:
        # Split-18: equal chunks of ceil(dim / n), the last one smaller
        chunk = -(-dim // num_outputs)
        sizes = [min(chunk, max(dim - i * chunk, 0)) for i in range(num_outputs)]
        return sizes
    if dim % n:
        raise ValueError(f"Split: axis of size {dim} cannot be split into {n} equal parts")
    return [dim // n] * n


def _split(xp, x, axis, sizes):
    a = norm_axis(axis, x.ndim, "Split")
    out, start = [], 0
    for s in sizes:
        out.append(x[slice_along(a, start, start + s)])
        start += s
    return tuple(out)


@kernel("Split", since=(1, 2, 11), host_inputs=(1,))
def split_attr(node, xp):
    axis = node.attr("axis", 0)
    attr_split = node.attr("split", None)
    n = node.num_outputs

    def run(x, split=None):
        # Split-1 also accepted the sizes as an optional second input
        sizes = ints(split) if split is not None else attr_split
        a = norm_axis(axis, x.ndim, "Split")
        return _split(xp, x, axis, _parts(x.shape[a], sizes and list(sizes), n, None))

    return run


@kernel("Split", since=(13, 18), host_inputs=(1,))
def split(node, xp):
    axis = node.attr("axis", 0)
    num_outputs = node.attr("num_outputs", None) if node.opset >= 18 else None
    n = node.num_outputs

    def run(x, split=None):
        sizes = ints(split) if split is not None else None
        a = norm_axis(axis, x.ndim, "Split")
        return _split(xp, x, axis, _parts(x.shape[a], sizes, n, num_outputs))

    const = node.const_input(1) if node.has_input(1) else None
    if node.has_input(1) and const is None:
        return run
    fixed = ints(const) if const is not None else None
    memo: dict[tuple, tuple[tuple, ...]] = {}

    def run_fixed(x, split=None):
        # sizes from the node alone: each input shape's index tuples worked out once (a
        # decode step splits a few small rows; the sizes' checks cost 3 of a node's 5 us)
        index = memo.get(x.shape)
        if index is None:
            a = norm_axis(axis, x.ndim, "Split")
            index, start = [], 0
            for size in _parts(x.shape[a], fixed, n, num_outputs):
                index.append(slice_along(a, start, start + size))
                start += size
            index = tuple(index)
            if len(memo) < 64:
                memo[x.shape] = index
        return tuple([x[i] for i in index])

    return run_fixed
