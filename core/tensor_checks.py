"""Tensor data checked against its dims and element type before anything reads it.

A tensor whose data is shorter (or longer) than its dims need would
otherwise surface far from its cause: as a value "used before it is
produced" when the plan cannot read the constant, or as a bare ``ValueError``
from ``onnx`` while reading external data. Here it is one ``InvalidModel``
naming the tensor, what it holds and what its dims need.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import AttributeProto, TensorProto, external_data_helper

from .errors import InvalidModel

#: Bits per element where several elements share a byte.
_PACKED_BITS = {
    TensorProto.INT4: 4,
    TensorProto.UINT4: 4,
    TensorProto.FLOAT4E2M1: 4,
    TensorProto.INT2: 2,
    TensorProto.UINT2: 2,
    TensorProto.FLOAT6E2M3: 6,
    TensorProto.FLOAT6E3M2: 6,
}


def _type_name(data_type: int) -> str:
    try:
        return TensorProto.DataType.Name(data_type)
    except ValueError:
        return f"element type {data_type}"


def element_count(t: TensorProto, what: str) -> int:
    for d in t.dims:
        if d < 0:
            raise InvalidModel(f"{what} has a negative dimension in dims {list(t.dims)}")
    return math.prod(t.dims)


def raw_size(t: TensorProto, count: int) -> int | None:
    """The bytes ``count`` elements of ``t``'s type take, or None for strings."""
    if t.data_type == TensorProto.STRING:
        return None
    bits = _PACKED_BITS.get(t.data_type)
    if bits is not None:
        return (count * bits + 7) // 8
    return onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize * count


def _typed_count(t: TensorProto, count: int) -> int:
    """How many entries the typed field (float_data, int32_data...) must hold."""
    if t.data_type in (TensorProto.COMPLEX64, TensorProto.COMPLEX128):
        return 2 * count
    bits = _PACKED_BITS.get(t.data_type)
    if bits is not None and bits != 6:  # 6-bit types keep one element per int32 entry
        return (count * bits + 7) // 8
    return count


def _known_type(t: TensorProto, what: str) -> None:
    if t.data_type == TensorProto.UNDEFINED or t.data_type not in TensorProto.DataType.values():
        raise InvalidModel(f"{what} has no valid element type ({_type_name(t.data_type)})")


def check_tensor(t: TensorProto, what: str) -> None:
    """Embedded data must fill ``t``'s dims exactly; external data is checked when read."""
    _known_type(t, what)
    count = element_count(t, what)
    if external_data_helper.uses_external_data(t):
        return
    if t.HasField("raw_data"):
        want = raw_size(t, count)
        if want is None:
            raise InvalidModel(
                f"{what} is a STRING tensor with raw_data; strings go in string_data"
            )
        got = len(t.raw_data)
        if got != want:
            raise InvalidModel(
                f"{what} has {got} bytes of raw_data, but dims {list(t.dims)} of "
                f"{_type_name(t.data_type)} need {want}"
            )
        return
    field = onnx.helper.tensor_dtype_to_field(t.data_type)
    got = len(getattr(t, field))
    want = _typed_count(t, count)
    if got != want:
        if got == 0 and not _other_fields(t, field):
            detail = "no data"
        else:
            detail = f"{got} entries in {field}"
        raise InvalidModel(
            f"{what} has {detail}, but dims {list(t.dims)} of {_type_name(t.data_type)} need {want}"
        )


def _other_fields(t: TensorProto, field: str) -> list[str]:
    fields = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")
    return [f for f in fields if f != field and len(getattr(t, f))]


def graph_tensors(graph: onnx.GraphProto, where: str) -> Iterator[tuple[TensorProto, str]]:
    """Every dense tensor a graph holds (initializers, node attributes, sparse parts), nested."""
    for t in graph.initializer:
        yield t, f"initializer {t.name!r} of {where}"
    for sp in graph.sparse_initializer:
        yield sp.values, f"sparse initializer {sp.values.name!r} (values) of {where}"
        yield sp.indices, f"sparse initializer {sp.values.name!r} (indices) of {where}"
    yield from _node_tensors(graph.node, where)


def _node_tensors(nodes, where: str) -> Iterator[tuple[TensorProto, str]]:
    for node in nodes:
        label = f"{node.op_type} node {node.name!r}"
        for attr in node.attribute:
            what = f"attribute {attr.name!r} of {label} in {where}"
            if attr.type == AttributeProto.TENSOR and attr.HasField("t"):
                yield attr.t, what
            elif attr.type == AttributeProto.TENSORS:
                yield from ((t, f"{what} (tensor {i})") for i, t in enumerate(attr.tensors))
            elif attr.type == AttributeProto.SPARSE_TENSOR and attr.HasField("sparse_tensor"):
                yield attr.sparse_tensor.values, f"{what} (values)"
                yield attr.sparse_tensor.indices, f"{what} (indices)"
            elif attr.type == AttributeProto.GRAPH:
                yield from graph_tensors(attr.g, f"{where} > {label} attribute {attr.name!r}")
            elif attr.type == AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from graph_tensors(g, f"{where} > {label} attribute {attr.name!r}")


def model_tensors(proto: onnx.ModelProto) -> Iterator[tuple[TensorProto, str]]:
    yield from graph_tensors(proto.graph, f"graph {proto.graph.name!r}")
    for f in proto.functions:
        yield from _node_tensors(f.node, f"function {f.domain}:{f.name}")


def check_tensor_data(proto: onnx.ModelProto) -> None:
    """Every embedded tensor in the model holds exactly the data its dims need."""
    for t, what in model_tensors(proto):
        check_tensor(t, what)


#: The keys onnx defines for ``external_data`` (``basepath`` is onnx's own, set on load).
EXTERNAL_KEYS = ("location", "offset", "length", "checksum", "basepath")


@dataclass(frozen=True)
class ExternalRef:
    """Where a tensor's external data lies: a file beside the model, an offset, a length."""

    location: str
    offset: int
    length: int | None


def external_ref(t: TensorProto, what: str, notes: list[str]) -> ExternalRef:
    """Parse ``t.external_data``; an unknown or malformed entry is an error.

    A key given twice is read from its last entry, as onnxruntime and onnx
    read it, with a note.
    """
    entries: dict[str, str] = {}
    for entry in t.external_data:
        if entry.key not in EXTERNAL_KEYS:
            raise InvalidModel(
                f"{what} has an unknown external_data key {entry.key!r} "
                f"(ONNX defines {', '.join(EXTERNAL_KEYS)})"
            )
        if entry.key in entries:
            notes.append(
                f"{what} gives external_data key {entry.key!r} twice ({entries[entry.key]!r}, "
                f"{entry.value!r}); the last is read, as onnxruntime reads it"
            )
        entries[entry.key] = entry.value
    if not entries.get("location"):
        raise InvalidModel(f"{what} is stored externally but names no location")
    numbers: dict[str, int | None] = {}
    for key in ("offset", "length"):
        text = entries.get(key)
        try:
            numbers[key] = int(text) if text else None
        except ValueError:
            raise InvalidModel(
                f"{what} has external_data {key} {text!r}, which is not an integer"
            ) from None
        if (numbers[key] or 0) < 0:
            raise InvalidModel(f"{what} has a negative external_data {key} ({text})")
    return ExternalRef(entries["location"], numbers["offset"] or 0, numbers["length"])


def check_external_range(t: TensorProto, ref: ExternalRef, file: Path, what: str) -> int:
    """The tensor's offset and length lie inside ``file`` and match its dims; the byte count."""
    count = element_count(t, what)
    want = raw_size(t, count)
    if want is None:
        raise InvalidModel(f"{what} is a STRING tensor in external data, which ONNX does not allow")
    size = file.stat().st_size
    where = (
        f"external data {ref.location!r} (offset {ref.offset}, length {ref.length}, "
        f"file size {size})"
    )
    if ref.length is not None and ref.length != want:
        raise InvalidModel(
            f"{what}: {where} holds {ref.length} bytes, but dims {list(t.dims)} of "
            f"{_type_name(t.data_type)} need {want}"
        )
    if ref.offset + want > size:
        raise InvalidModel(
            f"{what}: {where} runs past the end of the file; dims {list(t.dims)} of "
            f"{_type_name(t.data_type)} need {want} bytes from offset {ref.offset}"
        )
    return want
