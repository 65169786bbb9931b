"""The onnxep provider SDK: everything a provider package needs, and nothing from the session."""

from onnxep.plugins.host import GROUP, DiscoveredProvider, PluginFailure, PluginHost

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
    "FLOAT8_TYPES",
    "FLOAT_TYPES",
    "GROUP",
    "INT_TYPES",
    "NUMERIC_TYPES",
    "SIGNED_INT_TYPES",
    "UNSIGNED_INT_TYPES",
    "Claim",
    "Decline",
    "FusionPass",
    "DiscoveredProvider",
    "KernelConflict",
    "KernelLibrary",
    "KernelRegistry",
    "KernelSpec",
    "NodeInfo",
    "PluginFailure",
    "PluginHost",
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
