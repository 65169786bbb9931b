"""SequenceErase: a copy of the sequence without the tensor at ``position`` (default: last)."""

from onnxep.providers.kernel import kernel

from .flow import SEQUENCE_NOTE, host_int, norm_position


@kernel(
    "SequenceErase",
    since=11,
    host_inputs=(1,),
    capture_safe=False,
    capture_note=SEQUENCE_NOTE,
)
def sequence_erase(node, xp):
    def run(seq, position=None):
        pos = -1 if position is None else host_int(position)
        p = norm_position(pos, len(seq), insert=False, op="SequenceErase")
        # a new list: the input sequence may still be read elsewhere
        return (seq[:p] + seq[p + 1 :],)

    return run
