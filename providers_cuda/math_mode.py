"""Whether float32 products may run on TF32 tensor cores in the current run.

The provider's ``use_tf32`` option, made current by ``CUDAProvider.run_context`` around
every run, so the cuDNN convolutions (:mod:`.dnn`) and cuBLAS products (:mod:`.blas`)
read it where they choose their math without each kernel carrying the provider's
options. A context variable, not a module flag: two sessions with different options
may run at once on two threads.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

_TF32: contextvars.ContextVar[bool] = contextvars.ContextVar("onnxep_cuda_tf32", default=False)


def tf32() -> bool:
    """True when float32 convolutions and GEMMs of this run may use TF32."""
    return _TF32.get()


@contextmanager
def allow_tf32(on: bool) -> Iterator[None]:
    token = _TF32.set(bool(on))
    try:
        yield
    finally:
        _TF32.reset(token)
