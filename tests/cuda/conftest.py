"""CUDA tests: run on a machine with an NVIDIA GPU and CuPy, skipped elsewhere with the reason."""

from __future__ import annotations

import pytest


def _why_no_gpu() -> str | None:
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CuPy built for another CUDA
        return f"CuPy is not importable here ({type(exc).__name__}: {exc})"
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            return "no CUDA device is visible"
    except Exception as exc:
        return f"no usable CUDA device or driver ({type(exc).__name__}: {exc})"
    return None


WHY_NO_GPU = _why_no_gpu()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/cuda/" not in str(item.fspath).replace("\\", "/"):
            continue
        item.add_marker(pytest.mark.cuda)
        if WHY_NO_GPU is not None:
            item.add_marker(pytest.mark.skip(reason=f"needs a CUDA GPU: {WHY_NO_GPU}"))
