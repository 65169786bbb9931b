"""The CUDA provider's options, checked once with errors that say what to write instead.

``device_id`` (int, default 0), ``gpu_mem_limit`` (bytes, default no limit;
an int, or a string such as ``"2GB"`` or ``"512MiB"``), and ``stream`` (an
external CUDA stream to run on: a CuPy stream, a raw ``cudaStream_t`` handle
as an int, or any object with ``__cuda_stream__`` or ``cuda_stream``, as
torch streams have), ``capture`` (``"off"``, ``"whole"``, ``"segmented"`` or
``"auto"``: how the plan is recorded as CUDA graphs; ``$ONNXEP_CUDA_CAPTURE``
overrides it), ``capture_warmup`` (eager runs per shape key before capturing,
default 2) and ``capture_cache`` (graphs kept per session, default 8; the
least recently used is dropped), ``use_tf32`` (0 or 1, default 0: float32 convolutions
and GEMMs on TF32 tensor cores, as onnxruntime's option of that name; onnxruntime's
default is 1, ours 0, as the CPU provider is the reference that float32 results are
checked against and TF32 rounds products to 10 mantissa bits). onnxruntime's
``enable_cuda_graph="1"`` asks for ``"whole"`` when ``capture`` is not given. onnxruntime's CUDA
options that have no meaning here are accepted and listed in ``ignored``,
so the same options dict works for both runtimes.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from onnxep.errors import ConfigError
from onnxep.providers import CAPTURE_MODES

KNOWN = (
    "device_id",
    "gpu_mem_limit",
    "stream",
    "capture",
    "capture_warmup",
    "capture_cache",
    "enable_cuda_graph",
    "use_tf32",
)
#: Sessions capture where they can unless told otherwise: warm-up runs, then whole or
#: segmented graphs (validated on the H200: decode in one graph, 2026-12-01).
DEFAULT_CAPTURE = "auto"
CAPTURE_ENV = "ONNXEP_CUDA_CAPTURE"
#: onnxruntime CUDA options that tune its own arena, cuDNN or graph code paths.
ORT_ONLY = frozenset(
    {
        "arena_extend_strategy",
        "cudnn_conv_algo_search",
        "cudnn_conv_use_max_workspace",
        "cudnn_conv1d_pad_to_nc1d",
        "do_copy_in_default_stream",
        "enable_skip_layer_norm_strict_mode",
        "has_user_compute_stream",
        "prefer_nhwc",
        "tunable_op_enable",
        "tunable_op_tuning_enable",
        "use_ep_level_unified_stream",
    }
)

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


@dataclass(frozen=True)
class CUDAOptions:
    device_id: int = 0
    gpu_mem_limit: int | None = None
    stream: Any = None
    ignored: tuple[str, ...] = field(default=())
    capture: str = DEFAULT_CAPTURE
    #: where ``capture`` came from: "option", "environment" or "default"
    capture_source: str = "default"
    capture_warmup: int = 2
    capture_cache: int = 8
    use_tf32: bool = False


def parse_bytes(value: Any) -> int:
    """``1 << 30``, ``"1GiB"``, ``"1.5GB"`` -> bytes; ConfigError for anything else."""
    if isinstance(value, bool):
        raise ConfigError(f"gpu_mem_limit must be a byte count, got {value!r}")
    if isinstance(value, (int, float)):
        n = int(value)
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT]?i?[bB]?)\s*", value)
        if m is None or m.group(2).lower() not in _UNITS:
            raise ConfigError(
                f"gpu_mem_limit {value!r} is not a size: give bytes as an int or a string "
                "such as '2GB' or '512MiB'"
            )
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    else:
        raise ConfigError(
            f"gpu_mem_limit must be an int or a size string, got {type(value).__name__}"
        )
    if n <= 0:
        raise ConfigError(f"gpu_mem_limit must be positive, got {value!r}")
    return n


def parse_options(options: Mapping[str, Any]) -> CUDAOptions:
    unknown = [k for k in options if k not in KNOWN and k not in ORT_ONLY]
    if unknown:
        raise ConfigError(
            f"unknown CUDA provider option(s) {', '.join(map(repr, sorted(unknown)))}; "
            f"the options are {', '.join(KNOWN)}"
        )
    dev = options.get("device_id", 0)
    try:
        device_id = int(dev)
    except (TypeError, ValueError):
        raise ConfigError(f"device_id must be an int, got {dev!r}") from None
    if isinstance(dev, bool) or device_id < 0 or str(device_id) != str(dev).strip():
        raise ConfigError(f"device_id must be a non-negative int, got {dev!r}")
    limit = options.get("gpu_mem_limit")
    # onnxruntime's default is SIZE_MAX (no limit); 0 is taken the same way.
    mem = None if limit in (None, 0, "0", 2**64 - 1) else parse_bytes(limit)
    capture, source = _capture_mode(options)
    return CUDAOptions(
        device_id=device_id,
        gpu_mem_limit=mem,
        stream=options.get("stream"),
        ignored=tuple(sorted(k for k in options if k in ORT_ONLY)),
        capture=capture,
        capture_source=source,
        capture_warmup=_count(options, "capture_warmup", 2, 0),
        capture_cache=_count(options, "capture_cache", 8, 1),
        use_tf32=_switch(options, "use_tf32"),
    )


def _capture_mode(options: Mapping[str, Any]) -> tuple[str, str]:
    env = os.environ.get(CAPTURE_ENV, "").strip()
    if env:
        raw, source, where = env, "environment", f"${CAPTURE_ENV}"
    elif "capture" in options:
        raw, source, where = options["capture"], "option", "the capture option"
    elif str(options.get("enable_cuda_graph", "0")).strip().lower() in ("1", "true"):
        raw, source, where = "whole", "option", "enable_cuda_graph"
    else:
        return DEFAULT_CAPTURE, "default"
    mode = str(raw).strip().lower()
    if mode not in CAPTURE_MODES:
        raise ConfigError(f"{where} must be one of {', '.join(CAPTURE_MODES)}, got {raw!r}")
    return mode, source


def _count(options: Mapping[str, Any], name: str, default: int, least: int) -> int:
    raw = options.get(name, default)
    try:
        n = int(raw)
    except (TypeError, ValueError):
        n = None
    if n is None or isinstance(raw, bool) or n < least or str(n) != str(raw).strip():
        raise ConfigError(f"{name} must be an integer of at least {least}, got {raw!r}")
    return n


def _switch(options: Mapping[str, Any], name: str) -> bool:
    """An onnxruntime-style 0/1 option (also True/False and their strings)."""
    raw = options.get(name, 0)
    v = str(raw).strip().lower()
    if v in ("1", "true"):
        return True
    if v in ("0", "false"):
        return False
    raise ConfigError(f"{name} must be 0 or 1, got {raw!r}")


def stream_handle(stream: Any) -> int:
    """The raw ``cudaStream_t`` of a stream option, as an int."""
    if isinstance(stream, bool):
        raise ConfigError(f"stream must be a CUDA stream or its handle, got {stream!r}")
    if isinstance(stream, int):
        return stream
    proto = getattr(stream, "__cuda_stream__", None)
    if callable(proto):
        return int(proto()[1])
    for attr in ("ptr", "cuda_stream", "handle"):
        v = getattr(stream, attr, None)
        if isinstance(v, int):
            return v
    raise ConfigError(
        f"stream must be a CuPy stream, a raw cudaStream_t handle (int) or an object with "
        f"__cuda_stream__ or cuda_stream (a torch stream); got {type(stream).__name__}"
    )
