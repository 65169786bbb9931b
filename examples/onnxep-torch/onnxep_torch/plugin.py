"""The plugin object named by the ``onnxep.providers`` entry point ``torch``."""

from __future__ import annotations

from typing import Any

import torch

from onnxep.providers import KernelLibrary, ProviderInfo, hookimpl

from .provider import TorchProvider, native_kernels


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
        # A torch-native kernel replaces the generic op in every version: a
        # generic registration left for a later opset would shadow it.
        native = native_kernels()
        mine = native.op_types()
        generic = KernelLibrary.from_package("onnxep.providers.ops")
        return [*(s for s in generic if (s.domain, s.op_type) not in mine), *native]


plugin = TorchPlugin()
