"""The onnxep provider SDK: everything a provider package needs, and nothing from the session.

Every contract a provider implements is here (hookspecs, ``Provider``, ``@kernel``, the
registry, rewrite passes, the capture contract); the machinery that discovers and starts
plugins is the core's (``onnxep.plugins``).
"""

from .capture import CAPTURE_MODES, CaptureBackend, CaptureConfig
from .dtypes import (
    ALL_TYPES,
    FLOAT8_TYPES,
    FLOAT_TYPES,
    INT_TYPES,
    NUMERIC_TYPES,
    SIGNED_INT_TYPES,
    UNSIGNED_INT_TYPES,
    dtype_name,
    elem_type,
    np_dtype,
)
from .hookspecs import hookimpl, hookspec
from .inplace import may_overwrite
from .kernel import KernelLibrary, KernelSpec, kernel
from .node import NodeInfo, Subgraph, ValueInfo
from .provider import Claim, Decline, Provider, ProviderInfo
from .registry import KernelConflict, KernelRegistry
from .rewrite import FusionPass, RewritePass

__all__ = [
    "ALL_TYPES",
    "CAPTURE_MODES",
    "CaptureBackend",
    "CaptureConfig",
    "FLOAT8_TYPES",
    "FLOAT_TYPES",
    "INT_TYPES",
    "NUMERIC_TYPES",
    "SIGNED_INT_TYPES",
    "UNSIGNED_INT_TYPES",
    "Claim",
    "Decline",
    "FusionPass",
    "KernelConflict",
    "KernelLibrary",
    "KernelRegistry",
    "KernelSpec",
    "NodeInfo",
    "Provider",
    "ProviderInfo",
    "RewritePass",
    "Subgraph",
    "ValueInfo",
    "dtype_name",
    "elem_type",
    "hookimpl",
    "hookspec",
    "kernel",
    "may_overwrite",
    "np_dtype",
]
