"""Build C++ source into a shared library with g++, once per content: the CUDA emulators' build.

Both kernel emulators (``cuda_emulation``, ``cuda_emulator``) compile a
kernel source wrapped in their host runtime; the library is cached in the
temp dir under the source's hash, so a rerun, or another test process,
reuses it. The library is written under a per-process name and renamed into
place, so two processes building the same source never load half a file.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path


def build_shared(
    source: str, flags: Sequence[str], tag: str, error: type[Exception] = RuntimeError
) -> Path:
    """The path of ``source`` built with ``g++ -shared -fPIC *flags``.

    ``tag`` names the cache directory; one tag must always be built with the
    same flags (the cache key is the source alone). A failed build raises
    ``error`` with the end of g++'s report.
    """
    digest = hashlib.sha1(source.encode()).hexdigest()[:16]
    cache = Path(tempfile.gettempdir()) / f"onnxep-{tag}-{os.getuid()}"
    cache.mkdir(exist_ok=True)
    so = cache / f"{digest}.so"
    if so.exists():
        return so
    cpp = cache / f"{digest}.{os.getpid()}.cpp"
    cpp.write_text(source)
    tmp = cache / f"{digest}.{os.getpid()}.so"
    cmd = ["g++", *flags, "-shared", "-fPIC", "-w", "-o", str(tmp), str(cpp)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    cpp.unlink(missing_ok=True)
    if res.returncode:
        raise error(f"g++ could not build the kernels:\n{res.stderr[-6000:]}")
    os.replace(tmp, so)
    return so
