"""The CUDA provider's plugin object (entry point ``cuda``).

Until its kernels land it reports itself unavailable with the reason, so
asking for ``cuda`` by name is a clear error and ``providers=None`` skips it.
"""

from __future__ import annotations

import importlib.util

from onnxep.providers import ProviderInfo, hookimpl


def _unavailable() -> str | None:
    if importlib.util.find_spec("cupy") is None:
        return (
            "CuPy is not installed: pip install 'onnxep[cuda12]' or 'onnxep[cuda13]' "
            "to match your CUDA driver"
        )
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"no usable CUDA device: {type(exc).__name__}: {exc}"
    if n == 0:
        return "no CUDA device found"
    return "the CUDA provider's kernels are not built yet in this version of onnxep"


class CUDAPlugin:
    @hookimpl
    def onnxep_provider_info(self) -> ProviderInfo:
        return ProviderInfo(
            name="cuda",
            aliases=("CUDAExecutionProvider",),
            device="cuda",
            version="0.1.0",
            description="CuPy provider for NVIDIA GPUs",
            check=_unavailable,
        )


plugin = CUDAPlugin()
