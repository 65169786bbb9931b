from onnxep.errors import NotSupported
from onnxep.providers.dtypes import dtype_name
from onnxep.providers.kernel import kernel

from .elementwise import onnx_to_dtype


def _bits(dt) -> int:
    name = dtype_name(dt)
    for width in (2, 4, 6):
        if name.endswith(f"int{width}") or name.startswith(f"float{width}"):
            return width
    return dt.itemsize * 8


@kernel("BitCast", since=26)
def bit_cast(node, xp):
    to = onnx_to_dtype(node.attr("to"))
    src = node.input_dtype(0)
    if to.kind in "OUS" or (src is not None and src.kind in "OUS"):
        raise NotSupported("BitCast: string tensors have no bit pattern to reinterpret")
    if src is not None and _bits(src) != _bits(to):
        raise NotSupported(f"BitCast: {dtype_name(src)} and {dtype_name(to)} differ in width")

    # Sub-byte types sit one per byte in their low bits, so a view moves them too.
    def run(x):
        return (x.view(to),)

    return run
