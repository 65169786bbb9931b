"""Loop on the CUDA provider: the generic host orchestration, its body's nodes on the GPU.

Why the node stays on the host while its body runs on the device: ``host_flow``.
"""

from onnxep.providers.ops import op_loop as generic

from .host_flow import on_host

loop = on_host(generic.loop, __name__)
