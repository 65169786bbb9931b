"""The CUDA provider's plugin object (entry point ``cuda``).

Nothing here imports CuPy: the availability check reads the driver through
ctypes, and the provider and its kernels are imported only when a session
asks for ``cuda``.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers import ProviderInfo, hookimpl

from .availability import unavailable_reason


class CUDAPlugin:
    @hookimpl
    def onnxep_provider_info(self) -> ProviderInfo:
        return ProviderInfo(
            name="cuda",
            aliases=("CUDAExecutionProvider",),
            device="cuda",
            version="0.1.0",
            description="CuPy provider for NVIDIA GPUs",
            check=unavailable_reason,
        )

    @hookimpl
    def onnxep_create_provider(self, options: dict) -> Any:
        from .provider import CUDAProvider

        return CUDAProvider(options)

    @hookimpl
    def onnxep_kernels(self, provider: Any) -> Any:
        if provider.name != "cuda":
            return None
        from .library import cuda_library

        return cuda_library()


plugin = CUDAPlugin()
