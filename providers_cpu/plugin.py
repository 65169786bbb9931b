"""The CPU provider's plugin object, named by the ``onnxep.providers`` entry point ``cpu``."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers import KernelLibrary, ProviderInfo, hookimpl

from .provider import CPUProvider


class CPUPlugin:
    @hookimpl
    def onnxep_provider_info(self) -> ProviderInfo:
        return ProviderInfo(
            name="cpu",
            aliases=("CPUExecutionProvider",),
            device="cpu",
            version=np.__version__,
            description="NumPy reference provider",
        )

    @hookimpl
    def onnxep_create_provider(self, options: dict) -> CPUProvider:
        return CPUProvider(options)

    @hookimpl
    def onnxep_kernels(self, provider: Any) -> Any:
        if provider.name != "cpu":
            return None
        from . import ops

        generic = KernelLibrary.from_package("onnxep.providers.ops")
        return generic + KernelLibrary.from_package(ops)

    @hookimpl
    def onnxep_graph_rewrites(self, provider: Any, level: str) -> Any:
        if level != "extended" or provider is None or provider.name != "cpu":
            return None
        # Only the RMS norm: the other fusions' gain is one kernel launch instead of
        # several, which NumPy does not have; their generic kernels run the same steps.
        from onnxep.providers.fusions import FuseRMSNorm

        return [FuseRMSNorm()]


plugin = CPUPlugin()
