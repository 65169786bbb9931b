"""SequenceLength: the number of tensors in a sequence, as an int64 scalar on the host."""

import numpy as np

from onnxep.providers.kernel import kernel

from .flow import SEQUENCE_NOTE


@kernel(
    "SequenceLength",
    since=11,
    host_outputs=(0,),
    capture_safe=False,
    capture_note=SEQUENCE_NOTE,
)
def sequence_length(node, xp):
    def run(seq):
        return (np.array(len(seq), dtype=np.int64),)

    return run
