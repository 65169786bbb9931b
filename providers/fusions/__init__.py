"""Fusion passes any provider can contribute (``extended`` level), one pattern per module.

Each matches structure and dtypes only, refuses when an intermediate value
escapes to another consumer, and emits an op only where the bound provider
has a kernel for it.
"""

from .rms_norm import FuseRMSNorm

__all__ = ["FuseRMSNorm"]
