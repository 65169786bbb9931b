"""``onnxep bench``: onnxep and its peers timed side by side, interleaved, on identical inputs."""

from .api import BenchResult, bench
from .sides import SIDES, Side

__all__ = ["SIDES", "BenchResult", "Side", "bench"]
