"""A provider running some of providers_cuda's op modules on NumPy arrays, for sessions in
CPU tests: the modules' CUDA C runs on the kernel emulator (the tests patch the device door),
and, with ``flag``, the CUDA provider's error-flag hooks sit where it has them (kernels
built under the flag, checked at every copy to the host), so a bad index or length raises
through the executor as it does on the GPU."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np

import onnxep
from onnxep.providers import KernelLibrary, Provider, ProviderInfo, hookimpl
from onnxep.providers_cuda import error_flag


class EmulatedProvider(Provider):
    def __init__(self, name: str, options, flag: bool) -> None:
        super().__init__(name, options, device=name, xp=np)
        self.error_flag = error_flag.ErrorFlag.on_host() if flag else None

    def claim(self, node):
        if self.error_flag is None:
            return super().claim(node)
        with error_flag.building(self.error_flag):
            return super().claim(node)

    def to_host(self, value):
        if self.error_flag is None:
            return super().to_host(value)
        self.error_flag.before_sync()
        self.error_flag.after_sync()
        return value


class EmulatedPlugin:
    """The plugin of one :class:`EmulatedProvider` named ``name``, claiming with the kernels of
    ``modules`` (names in ``onnxep.providers_cuda.ops``)."""

    def __init__(self, name: str, modules: Sequence[str], flag: bool = True) -> None:
        self.name, self.modules, self.flag = name, tuple(modules), flag

    @hookimpl
    def onnxep_provider_info(self):
        return ProviderInfo(name=self.name, device=self.name)

    @hookimpl
    def onnxep_create_provider(self, options):
        return EmulatedProvider(self.name, options, self.flag)

    @hookimpl
    def onnxep_kernels(self, provider):
        if provider.name != self.name:
            return None
        from onnxep.providers_cuda import ops

        libs = [
            KernelLibrary.from_module(importlib.import_module(f"{ops.__name__}.{m}"))
            for m in self.modules
        ]
        return sum(libs[1:], libs[0])


@contextmanager
def registered(name: str, modules: Sequence[str], *, flag: bool = True) -> Iterator[str]:
    """The provider registered for the block (its name yielded), unregistered after it."""
    from onnxep.plugins.host import unregister_plugin

    plugin = EmulatedPlugin(name, modules, flag)
    onnxep.register_provider(plugin, name=f"{name}-emulator")
    try:
        yield name
    finally:
        unregister_plugin(plugin)
