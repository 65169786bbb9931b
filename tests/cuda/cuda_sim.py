"""A CPU stand-in for the CUDA provider's placement: same declines, generic kernels, no GPU.

Placement (claims, host shape math, copies) is decided at session creation,
before any kernel runs, so a provider that declines exactly what the CUDA
provider declines by op and dtype, on a device of its own, shows where
nodes and copies land. make_parity_table.py uses it to pick cases whose op
really runs on the device.
"""

from __future__ import annotations

import numpy as np

from onnxep.providers import Decline, KernelLibrary, Provider, ProviderInfo, hookimpl
from onnxep.providers_cuda.provider import CUDAProvider

NAME = "cudasim"


class _Sim(Provider):
    def __init__(self, options):
        super().__init__(NAME, options, device="cudasim", xp=np)

    def claim(self, node):
        why = CUDAProvider.decline_reason(node)
        return Decline(why) if why else super().claim(node)


class SimPlugin:
    @hookimpl
    def onnxep_provider_info(self):
        return ProviderInfo(name=NAME, device="cudasim")

    @hookimpl
    def onnxep_create_provider(self, options):
        return _Sim(options)

    @hookimpl
    def onnxep_kernels(self, provider):
        if provider.name == NAME:
            return KernelLibrary.from_package("onnxep.providers.ops") + KernelLibrary(
                s
                for s in KernelLibrary.from_package("onnxep.providers_cuda.ops")
                if s.op_type in ("If", "Loop", "Scan")  # host-orchestration kernels: no CuPy
            )


_registered = False


def register() -> None:
    global _registered
    if not _registered:
        import onnxep

        onnxep.register_provider(SimPlugin())
        _registered = True
