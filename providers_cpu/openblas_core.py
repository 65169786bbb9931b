"""Which OpenBLAS kernels NumPy runs, and whether faster ones fit this CPU.

The CPU provider's dense convolutions (im2col), Gemm and MatMul are OpenBLAS GEMMs,
and OpenBLAS's DYNAMIC_ARCH builds (numpy's wheels bundle one) run one core type's
kernels per process: detected at load, or forced by ``OPENBLAS_CORETYPE``. On an
AVX-512 CPU running an AVX2 core's kernels (the variable set to Haswell, or a CPU
OpenBLAS does not know: OpenBLAS issue #6029, Zen 5) those GEMMs took 1.1-1.7x as long
as on the SkylakeX kernels (docs/cpu_kernels.md, "OpenBLAS's kernels"). The library is
loaded before onnxep runs, so the provider cannot choose; it says so, once per process,
in ``onnxep providers`` and in every CPU session's notes, with the variable to set.
"""

from __future__ import annotations

import functools
import os

# OpenBLAS core names (``gotoblas_corename``, threadpoolctl's ``architecture``) whose
# kernels use AVX-512.
AVX512_CORES = frozenset({"skylakex", "cooperlake", "sapphirerapids"})
# What OpenBLAS's SkylakeX kernels need (its own support_avx512 test).
AVX512_FLAGS = frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})


def advice(core: str, cpu_flags: frozenset[str] | None, forced: str | None) -> str | None:
    """A note when OpenBLAS runs ``core`` on a CPU whose ``cpu_flags`` fit faster kernels
    (``forced``: the process's OPENBLAS_CORETYPE); None when there is nothing to say."""
    if not core or core.lower() in AVX512_CORES or cpu_flags is None:
        return None
    if AVX512_FLAGS - cpu_flags:
        return None
    why = f"OPENBLAS_CORETYPE={forced} is set" if forced else "OpenBLAS did not detect AVX-512"
    return (
        f"OpenBLAS runs its {core} (AVX2) kernels on a CPU with AVX-512 ({why}): "
        f"OPENBLAS_CORETYPE=SkylakeX, set before Python starts, runs this provider's GEMMs "
        f"and im2col convolutions faster"
    )


def family_of(lines) -> tuple[str, int] | None:
    """(vendor_id, cpu family) of the first processor in /proc/cpuinfo's ``lines``, or None
    where either is missing."""
    vendor, family = None, None
    for line in lines:
        if not line.strip():  # the first processor's block ends here
            break
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "vendor_id":
            vendor = value
        elif key == "cpu family" and value.isdigit():
            family = int(value)
    return None if vendor is None or family is None else (vendor, family)


@functools.cache
def cpu_family() -> tuple[str, int] | None:
    """``family_of`` this machine's /proc/cpuinfo, read once; None where there is none."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return family_of(f)
    except OSError:
        return None


def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags from /proc/cpuinfo, or None where there is none."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


@functools.cache
def openblas_notes() -> tuple[str, ...]:
    """One note per loaded OpenBLAS whose kernels are slower than this CPU allows."""
    try:
        from threadpoolctl import threadpool_info

        libs = [i for i in threadpool_info() if i.get("internal_api") == "openblas"]
    except Exception:  # threadpoolctl missing or failing: nothing to inspect
        return ()
    flags, forced = cpu_flags(), os.environ.get("OPENBLAS_CORETYPE")
    notes = (advice(i.get("architecture") or "", flags, forced) for i in libs)
    return tuple(n for n in notes if n)
