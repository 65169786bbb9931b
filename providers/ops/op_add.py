from onnxep.providers.kernel import kernel


@kernel("Add", since=1)
def add(node, xp):
    def run(a, b):
        return (xp.add(a, b),)

    return run
