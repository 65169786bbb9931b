import math

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel

from . import elementwise as ew


@kernel("Gelu", since=20)
def gelu(node, xp):
    approximate = node.attr("approximate", "none")
    if isinstance(approximate, bytes):
        approximate = approximate.decode()
    if approximate == "none":

        def f(x):
            return 0.5 * x * (1 + ew.erf(xp, x * (1 / math.sqrt(2))))

    elif approximate == "tanh":
        k = math.sqrt(2 / math.pi)

        def f(x):
            return 0.5 * x * (1 + xp.tanh(k * (x + 0.044715 * x * x * x)))

    else:
        raise NotSupported(f"Gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return ew.unary(xp, f, ew.HALF_FLOATS)
