from onnxep.providers.kernel import kernel


@kernel("Concat", since=(1, 4))
def concat(node, xp):
    # Concat-1 defaulted the axis to 1; later versions require it
    axis = node.attr("axis", 1) if node.opset < 4 else node.attr("axis")

    def run(*xs):
        return (xp.concatenate(xs, axis=axis),)

    return run
