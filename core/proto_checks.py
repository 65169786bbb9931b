"""Checks on the protobuf itself, before any field is read as what it stands for.

protobuf does not validate UTF-8 when it parses ``string`` fields of a proto2
message such as ONNX's: a name with invalid UTF-8 reads back as ``bytes``,
which then fails far away (concatenating it to a ``str``). Element types are
plain ``int32`` fields, so any number parses, and a negative dim in a
declared shape makes onnx's own shape inference abort the process. An
attribute's value is read by its declared type, so a type that disagrees
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


def _bad_text(msg: Message, path: str) -> str | None:
    """The path of the first string field that is not valid UTF-8, or None."""
    text, subs, oneofs = _layout(msg)
    for name, repeated in text:
        value = getattr(msg, name)
        if repeated:
            for i, v in enumerate(value):
                if v.__class__ is not str:
                    return f"{path}.{name}[{i}]"
        elif value.__class__ is not str:
            return f"{path}.{name}"
    for name, repeated in subs:
        if repeated:
            for i, sub in enumerate(getattr(msg, name)):
                bad = _bad_text(sub, f"{path}.{name}[{i}]")
                if bad is not None:
                    return bad
        elif msg.HasField(name):
            bad = _bad_text(getattr(msg, name), f"{path}.{name}")
            if bad is not None:
                return bad
    for oneof in oneofs:
        name = msg.WhichOneof(oneof)
        if name is None:
            continue
        value = getattr(msg, name)
        if isinstance(value, Message):
            bad = _bad_text(value, f"{path}.{name}")
        elif isinstance(value, (str, bytes)) and value.__class__ is not str:
            bad = f"{path}.{name}"  # a string member of a oneof
        else:
            bad = None
        if bad is not None:
            return bad
    return None


def check_text(msg: Message, what: str = "model") -> None:
    """Every string field in ``msg`` (recursively) is valid UTF-8."""
    bad = _bad_text(msg, what)
    if bad is not None:
        raise InvalidModel(
            f"the model's field {bad} is not valid UTF-8 text; the file is damaged or not ONNX"
        )


_DATA_TYPES = frozenset(onnx.TensorProto.DataType.values())


def _type_fault(t: onnx.TypeProto) -> str | None:
    """What is wrong in ``t`` (nested): an element type outside ONNX's, a negative dim."""
    kind = t.WhichOneof("value")
    if kind in ("tensor_type", "sparse_tensor_type"):
        tensor = getattr(t, kind)
        if tensor.elem_type not in _DATA_TYPES:
            return (
                f"element type {tensor.elem_type}, which is not an ONNX data type "
                "(TensorProto.DataType)"
            )
        for axis, dim in enumerate(tensor.shape.dim):
            if dim.HasField("dim_value") and dim.dim_value < 0:
                # onnx's shape inference aborts the process on some of these (Slice).
                return f"dim {dim.dim_value} at axis {axis}; a dim is a size, never negative"
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


def check_value_types(graph: onnx.GraphProto, where: str = "") -> None:
    """Every declared input, output and value_info type is well formed (subgraphs too)."""
    where = where or f"graph {graph.name!r}"
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        fault = _type_fault(vi.type) if vi.HasField("type") else None
        if fault is not None:
            raise InvalidModel(f"{where}: value {vi.name!r} declares {fault}")
    for node in graph.node:
        for attr in node.attribute:
            subs = [attr.g] if attr.HasField("g") else list(attr.graphs)
            for sub in subs:
                check_value_types(sub, f"{where} > {node.op_type} {node.name!r} {attr.name!r}")


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
