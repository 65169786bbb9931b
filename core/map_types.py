"""Map types (``map(int64,tensor(float))``, ``seq(map(...))``) through onnx-ir, which has none.

onnx-ir 1.1 raises ``NotImplementedError: Map types are not supported yet`` on any
value declared with a map type, and every classifier skl2onnx or onnxmltools
converts declares one: ZipMap's output, ``seq(map(int64|string, tensor(float)))``.
So before the model is read into the IR, :func:`strip_map_types` takes the type off
every value (graph input, output, value_info, in subgraphs too) whose type holds a
map and remembers it; after, :func:`restore_map_types` gives those IR values a
:class:`MapType` (inside ``ir.SequenceType`` / ``ir.OptionalType`` where declared),
which ``get_inputs()``/``get_outputs()``, the feed checks and the kernels' ``ValueInfo``
(kind ``"map"``) read as they read onnx-ir's own types. Map values themselves are
Python dicts (keys ``int`` or ``str``), a sequence of maps a list of dicts, as
onnxruntime hands them over.
"""

from __future__ import annotations

from typing import Any

import onnx
import onnx_ir as ir

#: (graph path, value name) -> the declared TypeProto that holds a map.
MapTypes = dict[tuple[str, str], onnx.TypeProto]


class MapType:
    """``map(key, value)``: onnx-ir's type protocol (``dtype``, ``elem_type``), for maps.

    ``dtype`` is the value type's element type, as onnx-ir's sequence and optional
    types report their element's; ``key`` is the key's element type.
    """

    __slots__ = ("denotation", "key", "value")

    def __init__(self, key: ir.DataType, value: Any, denotation: str | None = None) -> None:
        self.key = key
        self.value = value
        self.denotation = denotation

    @property
    def dtype(self) -> ir.DataType:
        return self.value.dtype

    @property
    def elem_type(self) -> Any:
        return self.value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MapType) and (self.key, self.value) == (other.key, other.value)

    def __hash__(self) -> int:
        return hash((MapType, self.key, self.value))

    def __repr__(self) -> str:
        return f"Map({self.key!r}, {self.value!r})"


def holds_map(t: onnx.TypeProto) -> bool:
    which = t.WhichOneof("value")
    if which == "map_type":
        return True
    if which == "sequence_type":
        return holds_map(t.sequence_type.elem_type)
    if which == "optional_type":
        return holds_map(t.optional_type.elem_type)
    return False


def ir_type(t: onnx.TypeProto) -> Any:
    """The IR type of a TypeProto that may hold maps (None where nothing is declared)."""
    which = t.WhichOneof("value")
    den = t.denotation or None
    if which == "map_type":
        return MapType(ir.DataType(t.map_type.key_type), ir_type(t.map_type.value_type), den)
    if which == "sequence_type":
        return ir.SequenceType(ir_type(t.sequence_type.elem_type), denotation=den)
    if which == "optional_type":
        return ir.OptionalType(ir_type(t.optional_type.elem_type), denotation=den)
    if which is None:
        return None
    return ir.serde.deserialize_type_proto_for_type(t)


def _subgraphs(node: onnx.NodeProto):
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.name, 0, attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            for i, g in enumerate(attr.graphs):
                yield attr.name, i, g


def _find(graph: onnx.GraphProto, path: str, out: MapTypes) -> None:
    for vi in (*graph.input, *graph.output, *graph.value_info):
        if vi.HasField("type") and holds_map(vi.type):
            out[(path, vi.name)] = vi.type
    for n, node in enumerate(graph.node):
        for name, i, sub in _subgraphs(node):
            _find(sub, f"{path}/{n}.{name}.{i}", out)


def _strip(graph: onnx.GraphProto) -> None:
    for vi in (*graph.input, *graph.output, *graph.value_info):
        if vi.HasField("type") and holds_map(vi.type):
            vi.ClearField("type")
    for node in graph.node:
        for _, _, sub in _subgraphs(node):
            _strip(sub)


def strip_map_types(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, MapTypes]:
    """``proto`` with no map types left (a copy when it had some), and the types taken off."""
    found: MapTypes = {}
    _find(proto.graph, "", found)
    if not found:
        return proto, found
    stripped = onnx.ModelProto()
    stripped.CopyFrom(proto)
    _strip(stripped.graph)
    # The types stay valid when the copy is edited: they are copies too.
    return stripped, {k: _copy(t) for k, t in found.items()}


def _copy(t: onnx.TypeProto) -> onnx.TypeProto:
    c = onnx.TypeProto()
    c.CopyFrom(t)
    return c


def restore_map_types(model: ir.Model, types: MapTypes) -> None:
    """Give the IR values :func:`strip_map_types` stripped their declared map types back.

    Call it straight after deserialization: the IR's graphs and nodes are still
    in the proto's order, which is how subgraph paths are matched.
    """
    if types:
        _restore(model.graph, "", types)


def _restore(graph: ir.Graph, path: str, types: MapTypes) -> None:
    values: dict[str, ir.Value] = {}
    for v in graph.inputs:
        values[v.name or ""] = v
    for node in graph:
        for v in node.outputs:
            values[v.name or ""] = v
    for v in graph.outputs:
        values.setdefault(v.name or "", v)
    for (p, name), t in types.items():
        if p == path and name in values:
            values[name].type = ir_type(t)
    for n, node in enumerate(graph):
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                _restore(attr.value, f"{path}/{n}.{attr.name}.0", types)
            elif attr.type == ir.AttributeType.GRAPHS:
                for i, g in enumerate(attr.value):
                    _restore(g, f"{path}/{n}.{attr.name}.{i}", types)
