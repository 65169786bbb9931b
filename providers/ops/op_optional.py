"""Optional: wrap a value (the value itself) or make an empty optional (None)."""

from onnxep.providers.kernel import kernel

from .flow import OPTIONAL_NOTE


@kernel("Optional", since=(15, 28), capture_safe=False, capture_note=OPTIONAL_NOTE)
def optional(node, xp):
    def run(value=None):
        return (value,)

    return run
