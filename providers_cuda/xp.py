"""The namespace the CUDA provider hands its kernel builders: CuPy, with a matmul that captures.

Generic kernels compute with ``xp.matmul`` (Attention, Gemm, recurrent
cells...). CuPy's own matmul reaches cuBLAS through wrappers that refuse
inside stream capture, so this namespace is a copy of the ``cupy`` module's
attributes with ``matmul`` replaced by one that sends float16, float32 and
float64 operands to :func:`onnxep.providers_cuda.blas.matmul` and anything
else (integers, complex, keyword arguments) to CuPy's. Everything else is
CuPy's own object, so ``xp.ndarray``, ``xp.cuda`` and ``xp.fft`` behave as
in ``cupy``.
"""

from __future__ import annotations

import types
from typing import Any

_namespace: types.ModuleType | None = None


def cuda_namespace() -> types.ModuleType:
    global _namespace
    if _namespace is None:
        import cupy

        from . import blas

        ns = types.ModuleType("onnxep_cupy", "CuPy, with a capture-safe matmul (onnxep)")
        ns.__dict__.update({k: v for k, v in vars(cupy).items() if not k.startswith("__")})
        cupy_matmul = cupy.matmul
        supported = blas.SUPPORTED

        def matmul(a: Any, b: Any, out: Any = None, **kwargs: Any) -> Any:
            if (
                not kwargs
                and isinstance(a, cupy.ndarray)
                and isinstance(b, cupy.ndarray)
                and a.dtype == b.dtype
                and a.dtype in supported
                and a.ndim
                and b.ndim
            ):
                return blas.matmul(a, b, out=out)
            return cupy_matmul(a, b, out=out, **kwargs)

        ns.matmul = matmul
        ns.__onnxep_base__ = cupy
        # CuPy loads some submodules (fft, linalg, random...) on first access through its
        # module __getattr__; forward the names this copy does not hold yet.
        ns.__getattr__ = lambda name: getattr(cupy, name)
        _namespace = ns
    return _namespace
