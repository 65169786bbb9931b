"""The CUDA provider's plugin object (entry point ``cuda``).

Nothing here imports CuPy: the availability check reads the driver through
ctypes, and the provider and its kernels are imported only when a session
asks for ``cuda``.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers import CaptureConfig, ProviderInfo, hookimpl

from .availability import unavailable_reason


def _cudnn_status() -> str:
    """cuDNN's line (found where, which version, or why not), once CuPy is installed at all."""
    import importlib.util

    if importlib.util.find_spec("cupy") is None:
        return "cuDNN not looked for (no CuPy)"
    from .dnn_library import status

    return status()


class CUDAPlugin:
    @hookimpl
    def onnxep_provider_info(self) -> ProviderInfo:
        return ProviderInfo(
            name="cuda",
            aliases=("CUDAExecutionProvider",),
            device="cuda",
            version="0.1.0",
            description=f"CuPy provider for NVIDIA GPUs; {_cudnn_status()}",
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

    @hookimpl
    def onnxep_graph_rewrites(self, provider: Any, level: str) -> Any:
        if level != "extended" or provider is None or provider.name != "cuda":
            return None
        # Every fusion in onnxep.providers.fusions: each replaces several launches by one
        # (kernels in .ops: fused_cuda, the norm kernels, cuBLAS for the GEMMs), and Conv +
        # Relu/Clip into FusedConv, whose Relu runs in cuDNN's epilogue (ops/op_fused_conv).
        from onnxep.providers.fusions import FuseConvActivation, standard_fusions

        return [*standard_fusions(), FuseConvActivation()]

    @hookimpl
    def onnxep_capture_policy(self, provider: Any, options: dict) -> Any:
        """CUDA graphs for this provider's steps, as its ``capture`` options say."""
        if provider.name != "cuda":
            return None
        from .graphs import CudaGraphBackend

        opts = provider.cuda_options
        return CaptureConfig(
            mode=opts.capture,
            backend=lambda: CudaGraphBackend(provider),
            capturing=frozenset({provider.name, provider.device}),
            warmup=opts.capture_warmup,
            cache_size=opts.capture_cache,
            source=opts.capture_source,
        )


plugin = CUDAPlugin()
