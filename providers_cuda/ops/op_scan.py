"""Scan on the CUDA provider: host orchestration, its body's nodes on the GPU.

As in onnxruntime's CUDA provider, the control-flow node belongs to the
device provider while its values cross the subgraph boundary in host memory
(every input and output is declared host-side); the body is placed with the
session's providers, so its nodes run on the GPU like any other. The generic
kernel is built with NumPy, since everything it touches is on the host.
"""

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_scan as generic
from onnxep.providers.ops._flow import CONTROL_NOTE, HOST_ALL


@kernel(
    "Scan",
    since=8,
    host_inputs=HOST_ALL,
    host_outputs=HOST_ALL,
    capture_safe=False,
    capture_note=CONTROL_NOTE,
)
def scan8(node, xp):
    return generic.scan8(node, np)


@kernel(
    "Scan",
    since=(9, 11, 16),
    host_inputs=HOST_ALL,
    host_outputs=HOST_ALL,
    capture_safe=False,
    capture_note=CONTROL_NOTE,
)
def scan9(node, xp):
    return generic.scan9(node, np)
