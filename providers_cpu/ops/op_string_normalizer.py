"""StringNormalizer: stop-word removal and case change on [C] or [1, C] string tensors."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .misc import as_str_array, str_list, to_str


@kernel("StringNormalizer", since=10)
def string_normalizer(node: NodeInfo, xp: Any):
    action = to_str(node.attr("case_change_action", "NONE")).upper()
    if action not in ("NONE", "LOWER", "UPPER"):
        raise NotSupported(
            f"StringNormalizer: case_change_action {action!r} is not LOWER/UPPER/NONE"
        )
    sensitive = bool(node.attr("is_case_sensitive", 0))
    stop = str_list(node.attr("stopwords", None))
    # Case-insensitive matching compares case-folded forms.
    stopset = set(stop) if sensitive else {s.casefold() for s in stop}
    change = {"LOWER": str.lower, "UPPER": str.upper, "NONE": lambda s: s}[action]

    def run(x):
        a = as_str_array(x)
        if a.ndim not in (1, 2) or (a.ndim == 2 and a.shape[0] != 1):
            raise ValueError(f"StringNormalizer: input must be [C] or [1, C], got {a.shape}")
        words = a.reshape(-1).tolist()
        if stopset:
            words = [w for w in words if (w if sensitive else w.casefold()) not in stopset]
        out = np.array([change(w) for w in words] or [""], dtype=object)
        return (out.reshape(1, -1) if a.ndim == 2 else out,)

    return run
