"""onnxep: a Python runtime for ONNX models in which every device is a plugin."""

from . import errors
from .benchmark import BenchResult, bench
from .generate import GenerateResult, generate
from .iobinding import IOBinding
from .model_io import NodeArg
from .options import GraphOptimizationLevel, RunOptions, SessionOptions
from .ortvalue import OrtValue
from .placement import PlacementReport
from .registry_api import (
    ProviderStatus,
    get_all_providers,
    get_available_providers,
    plugin_failures,
    rediscover,
    register_provider,
)
from .session import InferenceSession, ModelMetadata

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
