"""The NumPy provider: onnxep's reference and last resort."""

from .provider import CPUProvider

__all__ = ["CPUProvider"]
