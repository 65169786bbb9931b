"""onnxep: a Python runtime for ONNX models in which every device is a plugin."""

from . import errors
from .compile.placement import PlacementReport
from .generation.greedy import GenerateResult, generate
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

__all__ = [
    "BenchResult",
    "GenerateResult",
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
