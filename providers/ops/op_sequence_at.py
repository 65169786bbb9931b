"""SequenceAt: the tensor at ``position`` (negative counts from the back)."""

from onnxep.providers.kernel import kernel

from .flow import SEQUENCE_NOTE, host_int, norm_position


@kernel(
    "SequenceAt",
    since=11,
    host_inputs=(1,),
    capture_safe=False,
    capture_note=SEQUENCE_NOTE,
)
def sequence_at(node, xp):
    def run(seq, position):
        p = norm_position(host_int(position), len(seq), insert=False, op="SequenceAt")
        return (seq[p],)

    return run
