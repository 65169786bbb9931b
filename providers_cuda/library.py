"""The CUDA provider's kernels: the generic library on CuPy, overridden by ``providers_cuda.ops``.

An op that ``providers_cuda/ops`` registers replaces the generic kernel
for every opset version (so a version the override lacks cannot fall
through to a generic kernel it meant to replace), and generic kernels that
reach cuBLAS or cuFFT through CuPy's wrappers are marked not capture-safe.
"""

from __future__ import annotations

from dataclasses import replace

from onnxep.providers import KernelLibrary

from .declines import CUPY_BLAS_NOTE, CUPY_BLAS_OPS


def cuda_library() -> KernelLibrary:
    generic = KernelLibrary.from_package("onnxep.providers.ops")
    own = KernelLibrary.from_package("onnxep.providers_cuda.ops")
    overridden = own.op_types()
    specs = []
    for spec in generic:
        key = (spec.domain, spec.op_type)
        if key in overridden:
            continue
        if key in CUPY_BLAS_OPS and spec.capture_safe:
            spec = replace(spec, capture_safe=False, capture_note=CUPY_BLAS_NOTE)
        specs.append(spec)
    return KernelLibrary([*specs, *own], [*generic.failures, *own.failures])
