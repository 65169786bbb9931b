"""What a kernel builder sees of a node: attributes, static types, shapes, subgraphs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

_MISSING: Any = object()

Dim = int | str | None


@dataclass(frozen=True)
class ValueInfo:
    """A value's static description, as far as the model declares or inference found it.

    ``kind`` is ``"tensor"``, ``"sequence"``, ``"optional"``, ``"map"`` or
    ``"unknown"``; ``dtype`` is the tensor (or element) dtype when known;
    ``shape`` is ``None`` when the rank is unknown, else one entry per dim (an
    int, a symbolic name, or ``None``); ``const`` holds the value when it is a
    constant known before the first run (an initializer or a Constant output).
    """

    name: str
    kind: str = "unknown"
    dtype: np.dtype | None = None
    shape: tuple[Dim, ...] | None = None
    const: Any = None

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    @property
    def static_shape(self) -> tuple[int, ...] | None:
        """The shape when every dim is a known integer, else ``None``."""
        if self.shape is None or not all(isinstance(d, int) for d in self.shape):
            return None
        return tuple(self.shape)  # type: ignore[arg-type]


class Subgraph(Protocol):
    """A compiled graph attribute (If branches, Loop and Scan bodies).

    ``run`` takes the graph's formal inputs and the values of the node's
    implicit (outer-scope) inputs, in the order of ``NodeInfo.implicit_inputs``,
    and returns the graph's outputs. Values cross this boundary in host memory.
    """

    input_names: tuple[str, ...]
    output_names: tuple[str, ...]

    def run(self, inputs: Sequence[Any], outer: Sequence[Any]) -> list[Any]: ...


@dataclass
class NodeInfo:
    """One node as a kernel builder sees it.

    ``inputs`` and ``outputs`` hold ``None`` where an optional one is omitted.
    ``implicit_inputs`` name the outer-scope values the node's subgraphs read;
    the executor passes their values after the explicit inputs.
    """

    op_type: str
    domain: str = ""
    name: str = ""
    opset: int = 0
    attrs: Mapping[str, Any] = field(default_factory=dict)
    inputs: tuple[ValueInfo | None, ...] = ()
    outputs: tuple[ValueInfo | None, ...] = ()
    subgraphs: Mapping[str, Any] = field(default_factory=dict)
    implicit_inputs: tuple[str, ...] = ()
    opsets: Mapping[str, int] = field(default_factory=dict)

    def attr(self, name: str, default: Any = _MISSING) -> Any:
        """Attribute ``name``; without a default, a missing one is an error naming the node."""
        if name in self.attrs:
            return self.attrs[name]
        if default is _MISSING:
            from onnxep.errors import NotSupported

            raise NotSupported(f"{self.op_type} node {self.name!r}: attribute {name!r} is required")
        return default

    def subgraph(self, name: str) -> Subgraph:
        return self.subgraphs[name]

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    @property
    def num_outputs(self) -> int:
        return len(self.outputs)

    def has_input(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] is not None

    def has_output(self, i: int) -> bool:
        return i < len(self.outputs) and self.outputs[i] is not None

    def input_dtype(self, i: int) -> np.dtype | None:
        v = self.inputs[i] if i < len(self.inputs) else None
        return None if v is None else v.dtype

    def const_input(self, i: int) -> Any:
        """The input's value when it is a constant, else ``None``."""
        v = self.inputs[i] if i < len(self.inputs) else None
        return None if v is None else v.const

    def describe(self) -> str:
        dom = self.domain or "ai.onnx"
        return f"{self.op_type} ({dom}, opset {self.opset}) node {self.name!r}"
