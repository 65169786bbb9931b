"""com.microsoft Inverse: the inverse of each square matrix in the last two dims."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument
from onnxep.providers.kernel import kernel


@kernel("Inverse", since=1, domain="com.microsoft", dtypes=("float", "float16", "double"))
def inverse(node: Any, xp: Any):
    def run(x):
        if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
            raise InvalidArgument(
                f"Inverse: input must end in a square matrix, got shape {x.shape}"
            )
        # float16 is inverted in float32, as onnxruntime does, and cast back
        work = x.astype(np.float32) if x.dtype == np.float16 else x
        try:
            inv = np.linalg.inv(work)
        except np.linalg.LinAlgError as exc:
            raise InvalidArgument(f"Inverse: a matrix of the input is singular ({exc})") from None
        return (inv.astype(x.dtype, copy=False),)

    return run
