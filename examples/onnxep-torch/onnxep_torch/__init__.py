"""onnxep-torch: an onnxep execution provider on PyTorch tensors."""

from .provider import TorchProvider

__all__ = ["TorchProvider"]
