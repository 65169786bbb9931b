"""If on the CUDA provider: the generic host orchestration, its branches' nodes on the GPU.

Why the node stays on the host while its body runs on the device: ``host_flow``.
"""

from onnxep.providers.ops import op_if as generic

from .host_flow import on_host

if_ = on_host(generic.if_, __name__)
