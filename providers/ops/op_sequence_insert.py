"""SequenceInsert: a copy of the sequence with a tensor inserted at ``position`` (default: end)."""

from onnxep.providers.kernel import kernel

from .flow import SEQUENCE_NOTE, host_int, norm_position


@kernel(
    "SequenceInsert",
    since=11,
    host_inputs=(2,),
    capture_safe=False,
    capture_note=SEQUENCE_NOTE,
)
def sequence_insert(node, xp):
    def run(seq, tensor, position=None):
        n = len(seq)
        p = n if position is None else host_int(position)
        p = norm_position(p, n, insert=True, op="SequenceInsert")
        # a new list: the input sequence may still be read elsewhere (a Loop's carried value)
        return ([*seq[:p], tensor, *seq[p:]],)

    return run
