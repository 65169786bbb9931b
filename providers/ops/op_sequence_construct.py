"""SequenceConstruct: the inputs, in order, as a sequence (a Python list)."""

from onnxep.providers.kernel import kernel

from .flow import SEQUENCE_NOTE


@kernel("SequenceConstruct", since=11, capture_safe=False, capture_note=SEQUENCE_NOTE)
def sequence_construct(node, xp):
    def run(*tensors):
        return (list(tensors),)

    return run
