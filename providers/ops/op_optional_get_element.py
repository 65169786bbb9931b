"""OptionalGetElement: the value inside an optional; from opset 18 a plain value passes through."""

from onnxep.providers.kernel import kernel

from .flow import OPTIONAL_NOTE


@kernel("OptionalGetElement", since=(15, 18, 28), capture_safe=False, capture_note=OPTIONAL_NOTE)
def optional_get_element(node, xp):
    def run(value):
        if value is None:
            raise ValueError("OptionalGetElement: the optional is empty")
        return (value,)

    return run
