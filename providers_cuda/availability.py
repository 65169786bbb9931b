"""Whether the CUDA provider can run here, answered without importing CuPy.

Discovery asks every enabled provider at session creation, so this check
runs even in sessions that never use the GPU; it must stay cheap and must
not import CuPy (whose import costs a second and initialises its own state).
It looks for CuPy's package, reads which CUDA major that package was built
for from its distribution name, and asks the driver (``libcuda`` through
ctypes) for its version and device count.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import json
import os
import sys
from urllib.parse import unquote, urlparse


def _checkout() -> str | None:
    """The folder onnxep is installed from in editable mode (``pip install -e``), if it is."""
    # Every onnxep distribution on the path: a checkout's own onnxep.egg-info (the
    # current folder) has no direct_url.json, the installed editable record has.
    for dist in importlib.metadata.distributions(name="onnxep"):
        try:
            info = json.loads(dist.read_text("direct_url.json") or "{}")
        except ValueError:
            continue
        if info.get("dir_info", {}).get("editable"):
            return unquote(urlparse(info.get("url", "")).path) or None
    return None


def install_command(extra: str) -> str:
    """How to add ``extra`` the way this onnxep was installed: from a checkout or the index."""
    where = _checkout()
    if where is not None:
        return f'pip install -e ".[{extra}]" (in the checkout {where})'
    return f'pip install "onnxep[{extra}]"'


def install_hint() -> str:
    return (
        f"{install_command('cuda12')} for CUDA 12 drivers, or the same with cuda13 for "
        "CUDA 13 drivers"
    )


# CUresult codes the message distinguishes (cuda.h).
_NO_DEVICE = 100
_INSUFFICIENT_DRIVER = 35
_NOT_INITIALIZED = 3


def cupy_cuda_major() -> int | None:
    """The CUDA major the installed CuPy wheel targets (cupy-cuda12x -> 12), if known."""
    for dist in importlib.metadata.distributions():
        name = (dist.metadata.get("Name") or "").lower()
        if name.startswith("cupy-cuda") and name.endswith("x"):
            digits = name[len("cupy-cuda") : -1]
            if digits.isdigit():
                return int(digits)
    return None


def _driver_library() -> ctypes.CDLL | None:
    names = ["nvcuda.dll"] if sys.platform == "win32" else ["libcuda.so.1", "libcuda.so"]
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def driver_status() -> tuple[int, int] | str:
    """``(driver CUDA version as 13000, device count)``, or why the driver is unusable."""
    lib = _driver_library()
    if lib is None:
        return (
            "no NVIDIA driver found (libcuda could not be loaded): install the NVIDIA "
            "driver, or run where a GPU is visible"
        )
    version = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return "the NVIDIA driver did not report its version; reinstall the driver"
    rc = lib.cuInit(0)
    if rc == _NO_DEVICE:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        extra = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
        return f"the NVIDIA driver sees no CUDA device{extra}"
    if rc == _INSUFFICIENT_DRIVER:
        return "the NVIDIA driver is older than the CUDA runtime needs: update the driver"
    if rc != 0:
        return f"the NVIDIA driver failed to initialise (cuInit error {rc})"
    count = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return "the NVIDIA driver could not count its devices"
    return version.value, count.value


def unavailable_reason() -> str | None:
    """``None`` when the CUDA provider can run here, else one sentence with the fix."""
    if importlib.util.find_spec("cupy") is None:
        return f"CuPy is not installed: {install_hint()}"
    status = driver_status()
    if isinstance(status, str):
        return status
    version, count = status
    if count == 0:
        return "no CUDA device found: the driver sees none"
    have = version // 1000
    want = cupy_cuda_major()
    if want is not None and have < want:
        return (
            f"the installed CuPy (cupy-cuda{want}x) needs a driver for CUDA {want}, but this "
            f"driver supports CUDA {have}.{version % 1000 // 10}: update the driver, or "
            f"pip uninstall cupy-cuda{want}x && {install_command(f'cuda{have}')}"
        )
    return None
