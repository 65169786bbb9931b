"""The CPU provider's plugin object, named by the ``onnxep.providers`` entry point ``cpu``."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers import KernelLibrary, ProviderInfo, hookimpl

from .jit import jit_status
from .openblas_core import openblas_notes
from .ops.conv_direct import status as conv_direct_status
from .ops.conv_gemm import status as conv_gemm_status
from .ops.weight_gemm import status as weight_gemm_status
from .provider import CPUProvider
from .threads import threadpoolctl_status


class CPUPlugin:
    @hookimpl
    def onnxep_provider_info(self) -> ProviderInfo:
        return ProviderInfo(
            name="cpu",
            aliases=("CPUExecutionProvider",),
            device="cpu",
            version=np.__version__,
            description="; ".join(
                [
                    "NumPy reference provider",
                    jit_status(),
                    threadpoolctl_status(),
                    *openblas_notes(),
                    conv_gemm_status(),
                    conv_direct_status(),
                    weight_gemm_status(),
                ]
            ),
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
        # The RMS and layer norms (reductions and elementwise nodes as one kernel), Conv +
        # activation (every activation the CPU FusedConv runs, conv_epilogue: it runs on
        # the Conv's output in cache, which saves a pass or several over memory and an
        # allocation), x * Sigmoid(x) (one buffer, not two) and an 8-bit product's or
        # convolution's rescale (float32 written by the integer product's epilogue, not an
        # int32 tensor, a float copy and two more passes). The other fusions' gain is one
        # kernel launch instead of several, which NumPy does not have. An unrolled RNN's
        # per-step input projections become one Gemm (the weight read once, not once a
        # step), and an unrolled LSTM cell's eleven small gate nodes one compiled node, a
        # GRU cell's sixteen likewise. On a small decoder's step, where each node is a few
        # microseconds of dispatch, a gated MLP's SiLU and Mul become one SwiGLU node, and
        # MatMuls reading one activation with constant weights (gate and up, Q/K/V and
        # their siblings) one product over the joined weights: one NumPy call, not four.
        from onnxep.providers.fusions import (
            FuseConvActivation,
            FuseConvIntegerToFloat,
            FuseDynamicQuantizeMatMul,
            FuseGRUCell,
            FuseLayerNorm,
            FuseLSTMCell,
            FuseRMSNorm,
            FuseSharedInputMatMuls,
            FuseSiLU,
            FuseStepGemms,
            FuseSwiGLU,
        )
        from onnxep.providers.fusions.conv_activation import EXTRA

        from . import jit

        passes = [
            FuseRMSNorm(),
            FuseLayerNorm(),
            FuseConvActivation(extra=EXTRA, residual=True),
            FuseSiLU(),
            FuseSwiGLU(),
            FuseSharedInputMatMuls(),
            FuseDynamicQuantizeMatMul(),
            FuseConvIntegerToFloat(),
            FuseStepGemms(),
            FuseLSTMCell(),
            FuseGRUCell(),
        ]
        if jit.wanted():
            # Last: the chains are what the fusions above left (a Relu after a Conv is
            # FusedConv's). Its gain is the compiled pass, so without numba it stays off.
            from .elementwise_chains import FuseElementwiseChains

            passes.append(FuseElementwiseChains())
        return passes


plugin = CPUPlugin()
