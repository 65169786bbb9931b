from onnxep.providers.kernel import kernel

from .elementwise import unary


@kernel("IsInf", since=(10, 20))
def is_inf(node, xp):
    pos = bool(node.attr("detect_positive", 1))
    neg = bool(node.attr("detect_negative", 1))
    if pos and neg:
        return unary(xp, xp.isinf, cast_back=False)
    if pos:
        return unary(xp, lambda x: x == float("inf"), cast_back=False)
    if neg:
        return unary(xp, lambda x: x == float("-inf"), cast_back=False)
    return unary(xp, lambda x: xp.zeros(x.shape, dtype=bool), cast_back=False)
