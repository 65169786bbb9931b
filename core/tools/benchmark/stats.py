"""Summaries of timing samples."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def summarize(samples_ms: Sequence[float]) -> dict[str, float]:
    a = np.asarray(samples_ms, dtype=np.float64)
    if a.size == 0:
        return {"median_ms": float("nan"), "p90_ms": float("nan"), "mean_ms": float("nan"), "n": 0}
    return {
        "median_ms": float(np.median(a)),
        "p90_ms": float(np.percentile(a, 90)),
        "mean_ms": float(a.mean()),
        "min_ms": float(a.min()),
        "n": int(a.size),
    }
