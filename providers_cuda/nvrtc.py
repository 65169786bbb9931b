"""NVRTC kernels compiled once per process and device, cached by source and options.

Kernel modules keep their CUDA C source as a string beside the Python that
launches it and ask this module for the compiled functions at session
creation, so nothing is compiled or loaded while a stream is being captured
(loading a module inside capture is illegal) and a second session reuses the
loaded module.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

_lock = threading.Lock()
_modules: dict[tuple[Any, ...], Any] = {}

#: Options every onnxep kernel is compiled with; fast math is never on, so
#: kernels round as the CPU reference does.
BASE_OPTIONS = ("--std=c++17",)


def raw_module(
    source: str, name_expressions: Sequence[str] = (), options: Sequence[str] = ()
) -> Any:
    """The ``cupy.RawModule`` for ``source`` on the current device, compiled and loaded once.

    ``name_expressions`` lists template instantiations (``"rms_norm<__half>"``)
    to be fetched with ``get_function`` under the same string.
    """
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    key = (source, tuple(name_expressions), tuple(options), dev)
    mod = _modules.get(key)
    if mod is not None:
        return mod
    with _lock:
        mod = _modules.get(key)
        if mod is None:
            mod = cupy.RawModule(
                code=source,
                options=(*BASE_OPTIONS, *options),
                name_expressions=tuple(name_expressions) or None,
            )
            mod.compile()
            _modules[key] = mod
    return mod


def function(
    source: str, name: str, name_expressions: Sequence[str] = (), options: Sequence[str] = ()
) -> Any:
    """One loaded kernel (a ``cupy.RawKernel``-like callable) from ``source``."""
    exprs = tuple(name_expressions) or ((name,) if "<" in name else ())
    return raw_module(source, exprs, options).get_function(name)


def cached_count() -> int:
    """How many modules this process has compiled (tests check reuse)."""
    return len(_modules)
