"""Finding and loading libcudnn, without CuPy (so the provider line and CPU tests can ask).

Where to look, in order (docs/cudnn.md says why):

1. ``$ONNXEP_CUDNN_LIBRARY``: a path to ``libcudnn.so.N`` (a missing file is an error
   that names it, not a silent search elsewhere);
2. a libcudnn this process already loaded (torch's, another framework's), from
   ``/proc/self/maps``, so the process holds one copy;
3. ``nvidia/cudnn/lib/libcudnn.so.*`` under every ``sys.path`` entry and site-packages
   folder: the ``nvidia-cudnn-cu12`` / ``-cu13`` wheels, which are not on the loader's
   path (the glob is torch's: ``libcudnn.so.*[0-9]``, so ``libcudnn_cnn.so.9`` and the
   other sub-libraries never match);
4. ``ctypes.util.find_library("cudnn")``: a system install.

cuDNN 9's ``libcudnn.so.9`` is a shim that opens its sub-libraries (``libcudnn_graph``,
``libcudnn_ops``, ``libcudnn_cnn``, the engine libraries) by soname on first use; the
wheel's copy finds them in its own folder (its RUNPATH is ``$ORIGIN``; torch loads
only this file the same way). Loading by absolute path with ``RTLD_GLOBAL`` keeps one
copy visible to every later ``dlopen``. :func:`load` then creates and destroys one
tensor, filter, convolution and pooling descriptor, which makes the shim open
``libcudnn_ops`` and ``libcudnn_cnn`` now (no GPU work), so a missing sub-library is
reported at session creation with cuDNN's own error string, not at the first Conv.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import site
import sys
import threading
from typing import Any

ENV = "ONNXEP_CUDNN_LIBRARY"
#: cudnnGetVersion() of 8.0.0: the legacy API this provider uses (v7 heuristics, Nd
#: descriptors, group counts, math types) is all there from 8.0 on.
MIN_VERSION = 8000


class DnnLoadError(RuntimeError):
    """libcudnn could not be found or loaded; the message says where it looked and why."""


def _proc_maps_path() -> str | None:
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if os.path.basename(path).startswith("libcudnn.so"):
                    return path
    except OSError:
        return None
    return None


def _search_roots() -> list[str]:
    roots: list[str] = []
    for p in sys.path:
        if p and p not in roots:
            roots.append(p)
    try:
        extra = list(site.getsitepackages())
        usp = site.getusersitepackages()
        if isinstance(usp, str):
            extra.append(usp)
    except Exception:  # site may be stubbed (virtualenv's old site.py)
        extra = []
    for p in extra:
        if p not in roots:
            roots.append(p)
    return roots


def _wheel_paths() -> list[str]:
    found: list[str] = []
    for root in _search_roots():
        pattern = os.path.join(root, "nvidia", "cudnn", "lib", "libcudnn.so.*[0-9]")
        for path in sorted(glob.glob(pattern)):
            if path not in found:
                found.append(path)
    return found


def candidates() -> tuple[list[str], list[str]]:
    """``(paths to try in order, what was looked at and not found)``."""
    env = os.environ.get(ENV, "").strip()
    if env:
        if not os.path.isfile(env):
            raise DnnLoadError(
                f"${ENV} is {env!r}, which is not a file: point it at libcudnn.so.9 (e.g. "
                "site-packages/nvidia/cudnn/lib/libcudnn.so.9) or unset it"
            )
        return [env], []
    tried: list[str] = []
    out: list[str] = []
    mapped = _proc_maps_path()
    if mapped:
        out.append(mapped)
    else:
        tried.append("no libcudnn loaded in this process")
    wheels = _wheel_paths()
    out.extend(p for p in wheels if p not in out)
    if not wheels:
        tried.append("no nvidia/cudnn/lib/libcudnn.so.* under sys.path or site-packages")
    system = ctypes.util.find_library("cudnn")
    if system:
        out.append(system)
    else:
        tried.append("ctypes.util.find_library('cudnn') found none")
    return out, tried


class Library:
    """A loaded libcudnn: the CDLL, its path and ``cudnnGetVersion()``."""

    def __init__(self, lib: Any, path: str, version: int) -> None:
        self.lib = lib
        self.path = path
        self.version = version

    @property
    def version_text(self) -> str:
        v = self.version
        # cuDNN 9 encodes major * 10000 + minor * 100 + patch; cuDNN 8 major * 1000 + ...
        if v >= 10000:
            major, minor, patch = v // 10000, v % 10000 // 100, v % 100
        else:
            major, minor, patch = v // 1000, v % 1000 // 100, v % 100
        return f"{major}.{minor}.{patch}"


def _error_string(lib: Any, status: int) -> str:
    try:
        fn = lib.cudnnGetErrorString
        fn.argtypes = [ctypes.c_int]
        fn.restype = ctypes.c_char_p
        return (fn(status) or b"?").decode(errors="replace")
    except Exception:
        return f"status {status}"


def _probe_sublibraries(lib: Any, path: str) -> None:
    """Create and destroy one descriptor of each kind: opens libcudnn_ops and libcudnn_cnn."""
    vp = ctypes.c_void_p
    for kind in ("Tensor", "Filter", "Convolution", "Pooling", "Activation"):
        create = getattr(lib, f"cudnnCreate{kind}Descriptor")
        create.argtypes = [ctypes.POINTER(vp)]
        create.restype = ctypes.c_int
        destroy = getattr(lib, f"cudnnDestroy{kind}Descriptor")
        destroy.argtypes = [vp]
        destroy.restype = ctypes.c_int
        d = vp()
        status = create(ctypes.byref(d))
        if status != 0:
            raise DnnLoadError(
                f"{path}: cudnnCreate{kind}Descriptor failed: {_error_string(lib, status)} "
                f"(status {status}); its sub-libraries (libcudnn_ops, libcudnn_cnn) must sit "
                "next to it, from the same cuDNN release, and their own dependencies "
                "(libcublasLt, libnvrtc of the same CUDA major) be loadable"
            )
        destroy(d)


def _open(path: str, probe: bool = True) -> Library:
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    get_version = lib.cudnnGetVersion
    get_version.argtypes = []
    get_version.restype = ctypes.c_size_t
    version = int(get_version())
    if version < MIN_VERSION:
        raise DnnLoadError(
            f"{path} is cuDNN {version}, older than 8.0 (cudnnGetVersion() < {MIN_VERSION}); "
            "install nvidia-cudnn-cu12 or nvidia-cudnn-cu13 (cuDNN 9)"
        )
    if probe:
        _probe_sublibraries(lib, path)
    return Library(lib, path, version)


def load(probe: bool = True) -> Library:
    """The first candidate that loads and is cuDNN 8 or later; DnnLoadError says why none.

    ``probe=False`` skips opening the sub-libraries (``libcudnn_ops``/``_cnn``, hundreds
    of MB): what the provider line at discovery asks, which must stay cheap.
    """
    paths, tried = candidates()
    errors = list(tried)
    for path in paths:
        try:
            return _open(path, probe)
        except DnnLoadError as exc:
            errors.append(str(exc))
        except (OSError, AttributeError) as exc:
            errors.append(f"{path}: {exc}")
    hint = (
        "pip install nvidia-cudnn-cu13 (or -cu12, matching your CuPy), or set "
        f"${ENV} to a libcudnn.so.9"
    )
    raise DnnLoadError("cuDNN not found (" + "; ".join(errors) + f"): {hint}")


_cached: Library | DnnLoadError | None = None
_lock = threading.Lock()


def library() -> Library:
    """:func:`load`, once per process (the failure too: its reason is reported, not retried)."""
    global _cached
    if _cached is None:
        with _lock:
            if _cached is None:
                try:
                    _cached = load()
                except DnnLoadError as exc:
                    _cached = exc
    if isinstance(_cached, DnnLoadError):
        raise _cached
    return _cached


def unavailable_reason() -> str | None:
    """None when cuDNN loads, else the sentence :func:`load` raised."""
    try:
        library()
    except DnnLoadError as exc:
        return str(exc)
    return None


def status() -> str:
    """One phrase for the provider's line in ``onnxep providers``.

    Cheap: it loads only ``libcudnn.so`` itself and asks its version (the sub-libraries
    are opened by :func:`library` when the first Conv-family kernel is built; a failure
    there is that kernel's capture note)."""
    if isinstance(_cached, Library):
        lib: Library | None = _cached
        reason = None
    elif isinstance(_cached, DnnLoadError):
        lib, reason = None, str(_cached)
    else:
        try:
            lib, reason = load(probe=False), None
        except DnnLoadError as exc:
            lib, reason = None, str(exc)
    if lib is not None:
        return f"cuDNN {lib.version_text} ({lib.path}) for Conv, ConvTranspose and the pools"
    return (
        f"{reason}; Conv, ConvTranspose and the pools run on the generic kernels (not capture-safe)"
    )


def _reset_for_tests() -> None:
    global _cached
    with _lock:
        _cached = None
