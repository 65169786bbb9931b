from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel

from .elementwise import cast_numeric
from .op_cast import cast_options, is_string

CAST_LIKE_VERSIONS = (15, 19, 21, 23, 24, 25)


@kernel("CastLike", since=CAST_LIKE_VERSIONS)
def cast_like(node, xp):
    if is_string(node.input_dtype(0)) or is_string(node.input_dtype(1)):
        raise NotSupported("CastLike: string tensors are cast by the CPU provider only")
    saturate, mode = cast_options(node)

    def run(x, like):
        return (cast_numeric(xp, x, like.dtype, saturate, mode),)

    return run
