"""The CPU provider instance: NumPy arrays in host memory.

Option ``intra_op_num_threads`` (the session's ``SessionOptions.intra_op_num_threads``
when set, as onnxruntime names it): the BLAS threads NumPy may use during this
provider's runs; 0 or absent leaves BLAS as the process configured it
(``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``), as NumPy itself does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument
from onnxep.providers import Provider

from .threads import blas_threads


class CPUProvider(Provider):
    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        super().__init__("cpu", options, device="cpu", xp=np)
        n = self.options.get("intra_op_num_threads", 0)
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
            raise InvalidArgument(
                f"intra_op_num_threads must be a whole number >= 0 (0: BLAS's own default), "
                f"got {n!r}"
            )
        self.threads = int(n)
        if self.threads:
            # only then: a session without a thread count enters nothing per run
            self.run_context = self._blas_threads

    def _blas_threads(self) -> contextlib.AbstractContextManager[Any] | None:
        return blas_threads(self.threads)

    def to_host(self, value: Any) -> Any:
        return value

    def from_host(self, value: Any) -> Any:
        return value
