"""The pass base class, which lives in the provider SDK so plugins can write passes too."""

from onnxep.providers.rewrite import FusionPass, RewritePass

__all__ = ["FusionPass", "RewritePass"]
