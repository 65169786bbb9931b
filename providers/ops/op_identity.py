from onnxep.providers.kernel import kernel


@kernel("Identity", since=1)
def identity(node, xp):
    def run(x):
        return (x,)

    return run
