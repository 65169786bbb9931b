"""Checks on the protobuf itself, before any field is read as what it stands for.

protobuf does not validate UTF-8 when it parses ``string`` fields of a proto2
message such as ONNX's: a name with invalid UTF-8 reads back as ``bytes``,
which then fails far away (concatenating it to a ``str``). onnxruntime (C++)
never decodes those fields and runs such a model, so each one is read with
its invalid bytes written as ``\\xNN`` escapes, and a load note says so.

Element types are plain ``int32`` fields, so any number parses; exporters
write ``-1`` for a dynamic dim (Paddle2ONNX), and a negative dim makes onnx's
own shape inference abort the process on some ops. onnxruntime reads a
negative dim as an unknown one, and so does onnxep: the dim is cleared before
shape inference, with a load note. A graph input or output with an element
type outside ONNX's is refused (onnxruntime refuses it too), and so is a
value_info entry with one for a value a node computes; one for any other
name (unused, or a graph output's twin) onnxruntime ignores, so it is
dropped with a note.

An attribute's value is read by its declared type, so a type that disagrees
with the field set is read as nothing. Such models are refused here, naming
the field, value or node.
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from onnx import AttributeProto

from .errors import InvalidModel


def _repeated(field: FieldDescriptor) -> bool:
    flag = getattr(field, "is_repeated", None)  # protobuf >= 5.29; ``label`` before it
    return bool(flag) if flag is not None else field.label == field.LABEL_REPEATED


#: Per message type: string fields (name, repeated), message fields outside a
#: oneof (name, repeated), and the names of its oneofs (one member read each).
_Layout = tuple[tuple[tuple[str, bool], ...], tuple[tuple[str, bool], ...], tuple[str, ...]]
_LAYOUTS: dict[str, _Layout] = {}


def _layout(msg: Message) -> _Layout:
    desc = msg.DESCRIPTOR
    got = _LAYOUTS.get(desc.full_name)
    if got is None:
        fields = desc.fields
        text = tuple((f.name, _repeated(f)) for f in fields if f.type == f.TYPE_STRING)
        subs = tuple(
            (f.name, _repeated(f))
            for f in fields
            if f.type == f.TYPE_MESSAGE and f.containing_oneof is None
        )
        oneofs = tuple(o.name for o in desc.oneofs)
        got = _LAYOUTS[desc.full_name] = (text, subs, oneofs)
    return got


#: How many fields a load note lists by name before it counts the rest.
_NAMED = 5


def _utf8(value: str | bytes) -> str:
    """A string field's text: invalid UTF-8 bytes written as ``\\xNN`` escapes."""
    return value if value.__class__ is str else value.decode("utf-8", "backslashreplace")


class _TextFixer:
    """Rewrites every string field that is not valid UTF-8, remembering where and as what."""

    def __init__(self) -> None:
        self.fixed: list[tuple[str, str]] = []  # (field path, text it now holds)
        self.escaped_text: set[str] = set()  # valid strings that look like an escape
        self.source: dict[str, bytes] = {}  # each fixed text and the bytes it was read from

    def text(self, value, path: str) -> str | None:
        """The fixed text of ``value`` when it needs fixing, else None."""
        if value.__class__ is str:
            if "\\x" in value:
                self.escaped_text.add(value)
            return None
        fixed = _utf8(value)
        self.fixed.append((path, fixed))
        if self.source.setdefault(fixed, value) != value:
            self.escaped_text.add(fixed)  # two different byte strings read as one text
        return fixed

    def walk(self, msg: Message, path: str) -> None:
        text, subs, oneofs = _layout(msg)
        for name, repeated in text:
            value = getattr(msg, name)
            if repeated:
                for i, v in enumerate(value):
                    fixed = self.text(v, f"{path}.{name}[{i}]")
                    if fixed is not None:
                        value[i] = fixed
            else:
                fixed = self.text(value, f"{path}.{name}")
                if fixed is not None:
                    setattr(msg, name, fixed)
        for name, repeated in subs:
            if repeated:
                for i, sub in enumerate(getattr(msg, name)):
                    self.walk(sub, f"{path}.{name}[{i}]")
            elif msg.HasField(name):
                self.walk(getattr(msg, name), f"{path}.{name}")
        for oneof in oneofs:
            name = msg.WhichOneof(oneof)
            if name is None:
                continue
            value = getattr(msg, name)
            if isinstance(value, Message):
                self.walk(value, f"{path}.{name}")
            elif isinstance(value, (str, bytes)):  # a string member of a oneof (a dim_param)
                fixed = self.text(value, f"{path}.{name}")
                if fixed is not None:
                    setattr(msg, name, fixed)


def normalise_text(msg: Message, notes: list[str], what: str = "model") -> None:
    """Every string field in ``msg`` (recursively) made valid UTF-8, with a note (module doc).

    An escaped name that equals a name the model already holds would join two
    values that onnxruntime keeps apart: that is refused.
    """
    fixer = _TextFixer()
    fixer.walk(msg, what)
    if not fixer.fixed:
        return
    clash = [(f, t) for f, t in fixer.fixed if t in fixer.escaped_text]
    if clash:
        field, text = clash[0]
        raise InvalidModel(
            f"the model's field {field} is not valid UTF-8 text, and read with escapes it "
            f"would be {text!r}, a name the model already uses; the file is damaged"
        )
    what = "text field(s) are not valid UTF-8, read with \\xNN escapes (onnxruntime runs them)"
    notes.append(_listed([f"{f} as {t!r}" for f, t in fixer.fixed], what))


_DATA_TYPES = frozenset(onnx.TensorProto.DataType.values())


def _type_fault(t: onnx.TypeProto) -> str | None:
    """What is wrong in ``t`` (nested): an element or key type outside ONNX's."""
    kind = t.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        tensor = getattr(t, kind)
        if tensor.elem_type not in _DATA_TYPES:
            return (
                f"element type {tensor.elem_type}, which is not an ONNX data type "
                "(TensorProto.DataType)"
            )
        return None
    if kind in ("sequence_type", "optional_type"):
        inner = getattr(t, kind)
        return _type_fault(inner.elem_type) if inner.HasField("elem_type") else None
    if kind == "map_type":
        if t.map_type.key_type not in _DATA_TYPES:
            return f"map key type {t.map_type.key_type}, which is not an ONNX data type"
        value = t.map_type
        return _type_fault(value.value_type) if value.HasField("value_type") else None
    return None


def _clear_negative_dims(t: onnx.TypeProto) -> list[str]:
    """Negative dims in ``t`` (nested) made unknown; each one as ``-1 at axis 0``."""
    kind = t.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        cleared = []
        for axis, dim in enumerate(getattr(t, kind).shape.dim):
            if dim.HasField("dim_value") and dim.dim_value < 0:
                cleared.append(f"{dim.dim_value} at axis {axis}")
                dim.ClearField("dim_value")
        return cleared
    if kind in ("sequence_type", "optional_type"):
        inner = getattr(t, kind)
        return _clear_negative_dims(inner.elem_type) if inner.HasField("elem_type") else []
    if kind == "map_type" and t.map_type.HasField("value_type"):
        return _clear_negative_dims(t.map_type.value_type)
    return []


def check_value_types(graph: onnx.GraphProto, notes: list[str], where: str = "") -> None:
    """Declared types of inputs, outputs and value_info, subgraphs too (see the module doc).

    A fault in a graph input or output, or in the value_info of a value a
    node computes, is an error; another value_info entry with one is dropped.
    Negative dims become unknown dims.
    """
    negative: list[str] = []
    dropped: list[str] = []
    _value_types(graph, where or f"graph {graph.name!r}", negative, dropped)
    if negative:
        notes.append(
            _listed(
                negative,
                "value(s) declare negative dims, read as unknown dims as "
                "onnxruntime does (the feeds give their sizes)",
            )
        )
    if dropped:
        notes.append(
            _listed(
                dropped,
                "value_info entries for no computed value declare a type that "
                "is not ONNX's and were dropped (onnxruntime ignores them)",
            )
        )


def _listed(entries: list[str], what: str) -> str:
    more = len(entries) - _NAMED
    tail = f" and {more} more" if more > 0 else ""
    return f"{len(entries)} {what}: {'; '.join(entries[:_NAMED])}{tail}"


def _value_types(graph: onnx.GraphProto, where: str, negative: list[str], dropped: list[str]):
    for vi in [*graph.input, *graph.output]:
        fault = _type_fault(vi.type) if vi.HasField("type") else None
        if fault is not None:
            raise InvalidModel(f"{where}: value {vi.name!r} declares {fault}")
    # onnxruntime reads a value_info entry's type for a value that a node produces and the
    # graph does not output; other entries it ignores, and a fault there is dropped.
    outputs = {vi.name for vi in graph.output}
    computed = {o for node in graph.node for o in node.output} - outputs
    for i in reversed(range(len(graph.value_info))):
        vi = graph.value_info[i]
        fault = _type_fault(vi.type) if vi.HasField("type") else None
        if fault is None:
            continue
        if vi.name in computed:
            raise InvalidModel(f"{where}: value {vi.name!r} declares {fault}")
        dropped.append(f"{vi.name!r} in {where} declares {fault.split(',')[0]}")
        del graph.value_info[i]
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        cleared = _clear_negative_dims(vi.type) if vi.HasField("type") else []
        if cleared:
            negative.append(f"{vi.name!r} in {where}: {', '.join(cleared)}")
    for node in graph.node:
        for attr in node.attribute:
            subs = [attr.g] if attr.HasField("g") else list(attr.graphs)
            for sub in subs:
                inner = f"{where} > {node.op_type} {node.name!r} {attr.name!r}"
                _value_types(sub, inner, negative, dropped)


def node_label(node: onnx.NodeProto, index: int, where: str = "") -> str:
    """``Add node 'add'``, or ``Add node 'Add_3'`` for an unnamed node (as placement names it)."""
    name = f"{node.op_type} node {node.name or f'{node.op_type}_{index}'!r}"
    return f"{name} in {where}" if where else name


#: Attribute types whose value lives in a message field that must be present.
_MESSAGE_FIELD = {
    AttributeProto.TENSOR: "t",
    AttributeProto.GRAPH: "g",
    AttributeProto.SPARSE_TENSOR: "sparse_tensor",
    AttributeProto.TYPE_PROTO: "tp",
}
#: Each attribute value field and the type it belongs to (onnx's checker pairs them so).
_SINGULAR_FIELDS = {
    "f": AttributeProto.FLOAT,
    "i": AttributeProto.INT,
    "s": AttributeProto.STRING,
    **{field: kind for kind, field in _MESSAGE_FIELD.items()},
}
_REPEATED_FIELDS = {
    "floats": AttributeProto.FLOATS,
    "ints": AttributeProto.INTS,
    "strings": AttributeProto.STRINGS,
    "tensors": AttributeProto.TENSORS,
    "graphs": AttributeProto.GRAPHS,
    "sparse_tensors": AttributeProto.SPARSE_TENSORS,
    "type_protos": AttributeProto.TYPE_PROTOS,
}
_ATTRIBUTE_TYPES = frozenset(AttributeProto.AttributeType.values())


def attribute_type_name(attr_type: int) -> str:
    try:
        return AttributeProto.AttributeType.Name(attr_type)
    except ValueError:
        return f"type {attr_type}"


def _check_attribute_fields(node: onnx.NodeProto, index: int, where: str) -> None:
    """Each attribute's type names a known kind and matches the one value field it sets.

    This holds for every node, with or without a schema: onnx-ir reads the
    value by the type, so a TENSOR attribute without a tensor would surface
    much later as a tensor that cannot be read.
    """
    for attr in node.attribute:
        label = f"{node_label(node, index, where)}: attribute {attr.name!r}"
        if attr.ref_attr_name:
            continue  # a function body's reference to the caller's attribute
        if attr.type == AttributeProto.UNDEFINED or attr.type not in _ATTRIBUTE_TYPES:
            raise InvalidModel(f"{label} has no valid type ({attribute_type_name(attr.type)})")
        used = [f for f in _SINGULAR_FIELDS if attr.HasField(f)]
        used += [f for f in _REPEATED_FIELDS if len(getattr(attr, f))]
        if len(used) > 1:
            raise InvalidModel(f"{label} sets several value fields ({', '.join(used)})")
        for field in used:
            kind = _SINGULAR_FIELDS.get(field, _REPEATED_FIELDS.get(field))
            if kind != attr.type:
                raise InvalidModel(
                    f"{label} is {attribute_type_name(attr.type)} but sets the "
                    f"{attribute_type_name(kind)} field {field!r}"
                )
        field = _MESSAGE_FIELD.get(attr.type)
        if field is not None and not attr.HasField(field):
            raise InvalidModel(f"{label} is {attribute_type_name(attr.type)} but has no value")


def check_attribute_fields(proto: onnx.ModelProto) -> None:
    """Every node's attributes (subgraphs and functions too), as ``_check_attribute_fields``."""
    bodies = [(proto.graph.node, f"graph {proto.graph.name!r}")]
    bodies += [(f.node, f"function {f.domain}:{f.name}") for f in proto.functions]
    for nodes, where in bodies:
        for node, index, scope in walk_nodes(nodes, where):
            _check_attribute_fields(node, index, scope)


def walk_nodes(nodes, where: str) -> Iterator[tuple[onnx.NodeProto, int, str]]:
    """Each node with its index and where it sits, then the nodes of its subgraphs."""
    for index, node in enumerate(nodes):
        yield node, index, where
        for attr in node.attribute:
            subs = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                inner = f"{where} > {node.op_type} {node.name!r} attribute {attr.name!r}"
                yield from walk_nodes(sub.node, inner)
