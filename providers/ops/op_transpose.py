from onnxep.providers.kernel import kernel


@kernel("Transpose", since=1)
def transpose(node, xp):
    perm = node.attr("perm", None)

    def run(x):
        p = tuple(perm) if perm is not None else tuple(range(x.ndim - 1, -1, -1))
        return (xp.transpose(x, p),)

    return run
