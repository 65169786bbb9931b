"""Scan on the CUDA provider: the generic host orchestration, its body's nodes on the GPU.

Why the node stays on the host while its body runs on the device: ``host_flow``.
"""

from onnxep.providers.ops import op_scan as generic

from .host_flow import on_host

scan8 = on_host(generic.scan8, __name__)
scan9 = on_host(generic.scan9, __name__)
