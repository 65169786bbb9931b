from onnxep.providers.kernel import kernel


@kernel("Relu", since=1)
def relu(node, xp):
    def run(x):
        return (xp.where(x > 0, x, xp.zeros((), dtype=x.dtype)),)

    return run
