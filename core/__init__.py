"""onnxep: a Python runtime for ONNX models in which every device is a plugin.

``import onnxep`` loads only this module and ``onnxep.errors``; each public name
imports its module on first use (PEP 562), so a command that lists providers
never imports onnx, and a session never imports the benchmark or the other tooling
(``onnxep.bench`` does, when called).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from . import errors

if TYPE_CHECKING:
    from .compile.placement import PlacementReport
    from .generation.generator import Generation, GenerationStats, Generator, generate
    from .generation.greedy import GenerateResult
    from .iobinding import IOBinding
    from .model_io import NodeArg
    from .options import GraphOptimizationLevel, RunOptions, SessionOptions
    from .ortvalue import OrtValue
    from .plugins.registration import (
        ProviderStatus,
        get_all_providers,
        get_available_providers,
        plugin_failures,
        rediscover,
        register_provider,
    )
    from .session import InferenceSession, ModelMetadata
    from .tools.benchmark import BenchResult, bench

__version__ = "0.1.0"

#: each public name and the module that defines it
_HOME = {
    "BenchResult": ".tools.benchmark",
    "GenerateResult": ".generation.greedy",
    "Generation": ".generation.generator",
    "GenerationStats": ".generation.generator",
    "Generator": ".generation.generator",
    "GraphOptimizationLevel": ".options",
    "IOBinding": ".iobinding",
    "InferenceSession": ".session",
    "ModelMetadata": ".session",
    "NodeArg": ".model_io",
    "OrtValue": ".ortvalue",
    "PlacementReport": ".compile.placement",
    "ProviderStatus": ".plugins.registration",
    "RunOptions": ".options",
    "SessionOptions": ".options",
    "bench": ".tools.benchmark",
    "generate": ".generation.generator",
    "get_all_providers": ".plugins.registration",
    "get_available_providers": ".plugins.registration",
    "plugin_failures": ".plugins.registration",
    "rediscover": ".plugins.registration",
    "register_provider": ".plugins.registration",
}

__all__ = [
    "BenchResult",
    "GenerateResult",
    "Generation",
    "GenerationStats",
    "Generator",
    "GraphOptimizationLevel",
    "IOBinding",
    "InferenceSession",
    "ModelMetadata",
    "NodeArg",
    "OrtValue",
    "PlacementReport",
    "ProviderStatus",
    "RunOptions",
    "SessionOptions",
    "__version__",
    "bench",
    "errors",
    "generate",
    "get_all_providers",
    "get_available_providers",
    "plugin_failures",
    "rediscover",
    "register_provider",
]


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module 'onnxep' has no attribute {name!r}")
    value = getattr(import_module(home, __name__), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})
