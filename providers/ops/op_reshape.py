import math

from onnxep.providers.kernel import kernel

from .shape import ints, reshaper


def target_shape(shape: list[int], in_shape: tuple, allowzero: bool) -> tuple[int, ...]:
    """Resolve ONNX's 0 (copy the input dim, unless allowzero) and -1 (infer)."""
    out = [in_shape[i] if d == 0 and not allowzero else d for i, d in enumerate(shape)]
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        total = math.prod(in_shape)
        out[out.index(-1)] = total // known if known else 0
    return tuple(out)


@kernel("Reshape", since=1)
def reshape_v1(node, xp):
    shape = [int(d) for d in node.attr("shape")]
    to_shape = reshaper(xp)

    def run(x):
        return (to_shape(x, target_shape(shape, x.shape, False)),)

    return run


@kernel("Reshape", since=(5, 14), host_inputs=(1,))
def reshape(node, xp):
    allowzero = bool(node.attr("allowzero", 0)) if node.opset >= 14 else False
    to_shape = reshaper(xp)
    const = node.const_input(1)
    if const is not None:
        fixed = ints(const)
        memo: dict[tuple, tuple] = {}

        def run_const(x, _shape):
            target = memo.get(x.shape)
            if target is None:
                target = target_shape(fixed, x.shape, allowzero)
                if len(memo) < 64:
                    memo[x.shape] = target
            return (to_shape(x, target),)

        return run_const

    def run(x, shape):
        return (to_shape(x, target_shape(ints(shape), x.shape, allowzero)),)

    return run
