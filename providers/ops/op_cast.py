from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel

from .elementwise import cast_numeric, onnx_to_dtype

CAST_VERSIONS = (1, 6, 9, 13, 19, 21, 23, 24, 25, 28)


def cast_options(node) -> tuple[bool, str]:
    """``saturate`` (float8 targets) and ``round_mode`` (float8e8m0 target)."""
    mode = node.attr("round_mode", "up")
    if isinstance(mode, bytes):
        mode = mode.decode()
    if mode not in ("up", "down", "nearest"):
        raise NotSupported(f"{node.op_type}: round_mode {mode!r} is not one of up, down, nearest")
    return bool(node.attr("saturate", 1)), mode


def is_string(dt) -> bool:
    return dt is not None and dt.kind in "OUS"


@kernel("Cast", since=CAST_VERSIONS)
def cast(node, xp):
    to = onnx_to_dtype(node.attr("to"))
    if is_string(to) or is_string(node.input_dtype(0)):
        raise NotSupported("Cast: string tensors are cast by the CPU provider only")
    saturate, mode = cast_options(node)

    def run(x):
        return (cast_numeric(xp, x, to, saturate, mode),)

    return run
