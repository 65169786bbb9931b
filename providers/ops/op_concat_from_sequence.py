"""ConcatFromSequence: concatenate (``new_axis=0``) or stack (``new_axis=1``) a sequence."""

from onnxep.providers.kernel import kernel

from .flow import SEQUENCE_NOTE, norm_axis


@kernel("ConcatFromSequence", since=11, capture_safe=False, capture_note=SEQUENCE_NOTE)
def concat_from_sequence(node, xp):
    axis_attr = int(node.attr("axis"))
    new_axis = bool(node.attr("new_axis", 0))

    def run(seq):
        if not seq:
            raise ValueError("ConcatFromSequence: the input sequence is empty")
        rank = seq[0].ndim + (1 if new_axis else 0)
        axis = norm_axis(axis_attr, rank, "ConcatFromSequence")
        if new_axis:
            return (xp.stack(seq, axis=axis),)
        return (xp.concatenate(seq, axis=axis),)

    return run
