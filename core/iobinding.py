"""IOBinding: onnxruntime's bind-then-run API over an InferenceSession.

Inputs are bound as arrays (NumPy, or a provider's device arrays), outputs by
name; ``run_with_iobinding`` runs and keeps the outputs on the binding. The
raw-pointer form of onnxruntime's ``bind_input`` is not offered: Python
arrays carry their own memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import InvalidArgument


@dataclass
class BoundValue:
    """An output as onnxruntime's OrtValue shows it: ``numpy()``, ``shape()``, ``data_type()``."""

    value: Any

    def numpy(self) -> np.ndarray:
        v = self.value
        if hasattr(v, "get"):  # CuPy
            return v.get()
        return np.asarray(v)

    def shape(self) -> list[int]:
        return list(self.value.shape)

    def data_type(self) -> str:
        from onnxep.providers.dtypes import dtype_name

        return f"tensor({dtype_name(np.dtype(self.value.dtype))})"

    def device_name(self) -> str:
        return "cuda" if hasattr(self.value, "get") else "cpu"


class IOBinding:
    def __init__(self, session: Any) -> None:
        self._session = session
        self._inputs: dict[str, Any] = {}
        self._outputs: list[str] = []
        self._results: list[BoundValue] = []

    def bind_cpu_input(self, name: str, arr: np.ndarray) -> None:
        self._check_input(name)
        self._inputs[name] = arr

    def bind_input_array(self, name: str, arr: Any) -> None:
        """Bind any array (NumPy or a provider's device array) as input ``name``."""
        self._check_input(name)
        self._inputs[name] = arr

    def bind_ortvalue_input(self, name: str, value: Any) -> None:
        self._check_input(name)
        self._inputs[name] = value.value if isinstance(value, BoundValue) else value

    def bind_output(self, name: str, device_type: str = "cpu", *args: Any, **kwargs: Any) -> None:
        names = [o.name for o in self._session.get_outputs()]
        if name not in names:
            raise InvalidArgument(f"unknown output {name!r}; the model's outputs are {names}")
        if name not in self._outputs:
            self._outputs.append(name)

    def clear_binding_inputs(self) -> None:
        self._inputs.clear()

    def clear_binding_outputs(self) -> None:
        self._outputs.clear()
        self._results = []

    def get_outputs(self) -> list[BoundValue]:
        return list(self._results)

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        return [r.numpy() for r in self._results]

    def _check_input(self, name: str) -> None:
        names = [i.name for i in self._session.get_inputs()]
        names += [i.name for i in self._session.get_overridable_initializers()]
        if name not in names:
            raise InvalidArgument(f"unknown input {name!r}; the model's inputs are {names}")

    def _run(self, run_options: Any = None) -> None:
        names = self._outputs or [o.name for o in self._session.get_outputs()]
        outs = self._session.run(names, self._inputs, run_options)
        self._results = [BoundValue(v) for v in outs]
