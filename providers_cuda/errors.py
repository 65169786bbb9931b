"""The CUDA provider's own errors."""

from __future__ import annotations

from onnxep.errors import RunError


class DeviceOutOfMemory(RunError, MemoryError):
    """A run needed more device memory than ``gpu_mem_limit`` (or the GPU) allows.

    The failed run's arrays are released before this is raised, so the
    session stays usable: a later run with smaller inputs can succeed.
    """
