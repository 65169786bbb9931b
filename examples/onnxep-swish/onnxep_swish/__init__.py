"""A custom-op plugin: ``com.example::Swish`` (``x * sigmoid(beta * x)``) for the CPU provider.

It implements ``onnxep_kernels`` only: no ``onnxep_provider_info``, so it
offers no provider of its own; it adds a kernel to ``cpu`` without touching
that provider's package.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers import KernelSpec, NodeInfo, hookimpl, kernel

DOMAIN = "com.example"


@kernel("Swish", since=1, domain=DOMAIN, dtypes=["float", "double", "float16"])
def swish(node: NodeInfo, xp: Any):
    beta = float(node.attr("beta", 1.0))

    def run(x):
        # x * sigmoid(beta x) written as x / (1 + exp(-beta x)), in x's dtype.
        return (x / (1 + xp.exp(-beta * x)),)

    return run


class SwishPlugin:
    @hookimpl
    def onnxep_kernels(self, provider: Any) -> list[KernelSpec] | None:
        if provider.name != "cpu":
            return None
        return list(swish.__onnxep_kernels__)


plugin = SwishPlugin()
