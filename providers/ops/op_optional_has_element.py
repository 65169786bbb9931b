"""OptionalHasElement: whether an optional holds a value; a missing input counts as empty."""

import numpy as np

from onnxep.providers.kernel import kernel

from .flow import OPTIONAL_NOTE


@kernel(
    "OptionalHasElement",
    since=(15, 18, 28),
    host_outputs=(0,),
    capture_safe=False,
    capture_note=OPTIONAL_NOTE,
)
def optional_has_element(node, xp):
    def run(value=None):
        return (np.array(value is not None),)

    return run
