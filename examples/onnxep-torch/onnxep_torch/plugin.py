"""The plugin object named by the ``onnxep.providers`` entry point ``torch``."""

from __future__ import annotations

from typing import Any

import torch

from onnxep.providers import KernelLibrary, ProviderInfo, hookimpl

from . import kernels
from .provider import TorchProvider


class TorchPlugin:
    @hookimpl
    def onnxep_provider_info(self) -> ProviderInfo:
        return ProviderInfo(
            name="torch",
            aliases=("TorchExecutionProvider",),
            device="torch",
            version=torch.__version__,
            description="PyTorch tensors, on any torch device (option 'device')",
        )

    @hookimpl
    def onnxep_create_provider(self, options: dict) -> TorchProvider:
        return TorchProvider(options)

    @hookimpl
    def onnxep_kernels(self, provider: Any) -> Any:
        if provider.name != "torch":
            return None
        # The generic library first, then the torch-native kernels: a plugin
        # may replace its own registrations, so the native ones win.
        generic = KernelLibrary.from_package("onnxep.providers.ops")
        return [*generic, *KernelLibrary.from_module(kernels)]


plugin = TorchPlugin()
