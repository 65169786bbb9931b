"""The CPU provider instance: NumPy arrays in host memory."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from onnxep.providers import Provider


class CPUProvider(Provider):
    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        super().__init__("cpu", options, device="cpu", xp=np)

    def to_host(self, value: Any) -> Any:
        return value

    def from_host(self, value: Any) -> Any:
        return value
