"""Einsum via the namespace's einsum; half floats contract in float32."""

from onnxep.providers.kernel import kernel

from .reduce import widen


@kernel("Einsum", since=(12, 28))
def einsum(node, xp):
    equation = node.attr("equation")
    if isinstance(equation, bytes):
        equation = equation.decode()
    equation = equation.replace(" ", "")

    # Contraction-order search lets multi-operand einsums use BLAS-backed tensordot.
    optimize = node.num_inputs > 1

    def run(*operands):
        y = xp.einsum(equation, *(widen(o, xp) for o in operands), optimize=optimize)
        return (xp.asarray(y).astype(operands[0].dtype, copy=False),)

    return run
