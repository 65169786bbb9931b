"""The ``onnxep`` domain: ops onnxep's fusion passes emit (``onnxep.providers.fusions``).

Each generic kernel here is the unfused nodes' own generic kernels run one
after the other, so on a provider that runs the generic library a fused node
gives exactly what the nodes it replaced gave; a provider's specialised kernel
(one launch on CUDA) is what makes the fusion pay.
"""

from __future__ import annotations

#: The custom-op domain of the fused ops. Kernel modules write it out as a literal in
#: ``@kernel(..., domain="onnxep")``: the CUDA provider's claimed-op list is read from
#: those decorators statically (``providers_cuda.declines.claimed_ops``).
DOMAIN = "onnxep"

#: Input 0 dtypes every fused op takes.
FLOATS = ("float", "float16", "bfloat16", "double")
