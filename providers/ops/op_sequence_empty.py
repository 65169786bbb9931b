"""SequenceEmpty: an empty sequence (its ``dtype`` attribute only types it statically)."""

from onnxep.providers.kernel import kernel

from .flow import SEQUENCE_NOTE


@kernel("SequenceEmpty", since=11, capture_safe=False, capture_note=SEQUENCE_NOTE)
def sequence_empty(node, xp):
    def run():
        return ([],)

    return run
