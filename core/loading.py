"""Reading a model from a path, bytes or a ModelProto, and checking its structure.

``onnx.checker`` rejects ops that real exports carry in the default domain
without an ONNX schema (onnxruntime-genai's builder emits
``SimplifiedLayerNormalization`` there), so this module checks structure only
and leaves op existence to the providers' claims. External data is read only
from inside the model's folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import onnx
from google.protobuf.json_format import ParseError
from google.protobuf.message import DecodeError
from google.protobuf.text_format import ParseError as TextParseError
from onnx import external_data_helper

from .errors import InvalidGraph, InvalidModel
from .proto_checks import check_attribute_fields, check_value_types, normalise_text
from .schema_checks import check_node_schemas
from .tensor_checks import check_external_range, check_tensor_data, external_ref
from .version_checks import check_versions, import_used_domains

ModelLike = str | os.PathLike | bytes | onnx.ModelProto


@dataclass
class LoadedModel:
    proto: onnx.ModelProto
    path: Path | None


def read_model(model: ModelLike) -> LoadedModel:
    """Parse ``model`` without external data; raise InvalidModel with the reason."""
    if isinstance(model, onnx.ModelProto):
        # Loading normalises the proto in place (node order, dims, imports): the caller's
        # model stays as it was, as onnxruntime leaves it.
        proto = onnx.ModelProto()
        proto.CopyFrom(model)
        return LoadedModel(proto, None)
    if isinstance(model, (bytes, bytearray, memoryview)):
        try:
            proto = onnx.load_from_string(bytes(model))
        except (DecodeError, ValueError, RuntimeError) as exc:
            raise InvalidModel(f"the model bytes are not an ONNX model: {exc}") from None
        _refuse_external(proto, "bytes")
        return LoadedModel(proto, None)
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.exists():
            raise InvalidModel(f"model file {str(path)!r} does not exist")
        if path.is_dir():
            raise InvalidModel(f"{str(path)!r} is a folder; pass the .onnx file inside it")
        if not path.is_file():
            # A device or pipe (/dev/zero) would be read forever.
            raise InvalidModel(f"{str(path)!r} is not a regular file; pass an .onnx file")
        if path.suffix.lower() == ".json":
            # onnx.load reads .json as the JSON form of a ModelProto; a genai_config.json
            # (the folder's settings) is the common mistake here
            raise InvalidModel(
                f"{str(path)!r} is a JSON file, not an ONNX model; pass the .onnx file it goes "
                "with (a genai_config.json names it under model.decoder.filename)"
            )
        try:
            proto = onnx.load(str(path), load_external_data=False)
        except (DecodeError, ParseError, TextParseError, ValueError, RuntimeError, OSError) as exc:
            raise InvalidModel(f"{str(path)!r} is not an ONNX model: {exc}") from None
        if not proto.HasField("graph"):
            raise InvalidModel(f"{str(path)!r} is not an ONNX model: it has no graph")
        return LoadedModel(proto, path)
    raise InvalidModel(
        f"model must be a path, bytes or onnx.ModelProto, got {type(model).__name__}"
    )


def _external_tensors(proto: onnx.ModelProto):
    return [
        t
        for t in external_data_helper._get_all_tensors(proto)
        if external_data_helper.uses_external_data(t)
    ]


def _refuse_external(proto: onnx.ModelProto, what: str) -> None:
    if _external_tensors(proto):
        raise InvalidModel(
            f"the model given as {what} refers to external data; "
            "load it from its file path so the data can be found beside it"
        )


def load_external_data(loaded: LoadedModel, notes: list[str]) -> None:
    """Read external tensors, refusing any location outside the model's folder; load notes
    (a repeated key) go to ``notes``."""
    tensors = _external_tensors(loaded.proto)
    if not tensors:
        return
    if loaded.path is None:
        _refuse_external(loaded.proto, "a ModelProto")
    base = loaded.path.parent.resolve()
    for t in tensors:
        what = f"tensor {t.name!r}"
        ref = external_ref(t, what, notes)
        try:
            target = (base / ref.location).resolve()
        except (ValueError, OSError) as exc:
            raise InvalidModel(
                f"{what} names external data {ref.location!r}, which is not a usable path: {exc}"
            ) from None
        if not target.is_relative_to(base):
            raise InvalidModel(
                f"{what} points to external data {ref.location!r} outside the "
                f"model's folder {str(base)!r}; move the data beside the model"
            )
        if not target.is_file():
            raise InvalidModel(
                f"{what} needs external data file {ref.location!r}, which is not in {str(base)!r}"
            )
        size = check_external_range(t, ref, target, what)
        if ref.length is None:
            # onnx would read to the end of the file; onnxruntime reads what the dims need.
            t.external_data.add(key="length", value=str(size))
    try:
        external_data_helper.load_external_data_for_model(loaded.proto, str(base))
    except (ValueError, OSError, onnx.checker.ValidationError) as exc:
        # onnx also refuses symlinked or hard-linked data files (ValidationError).
        raise InvalidModel(f"the model's external data could not be read: {exc}") from None


def _graph_names(graph: onnx.GraphProto) -> set[str]:
    names = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    names |= {t.values.name for t in graph.sparse_initializer}
    return names


def check_graph(
    graph: onnx.GraphProto, outer: frozenset[str] = frozenset(), where: str = ""
) -> None:
    """Every input defined before use, every value assigned once, outputs produced.

    Nodes out of topological order are sorted in place; a cycle is an error.
    """
    where = where or f"graph {graph.name!r}"
    _refuse_duplicate_inputs(graph, where)
    defined = _graph_names(graph)
    produced: dict[str, int] = {}
    for idx, node in enumerate(graph.node):
        for o in node.output:
            if not o:
                continue
            if o in produced or o in defined:
                raise InvalidGraph(
                    f"{where}: value {o!r} is assigned twice (node {idx} "
                    f"{node.op_type} {node.name!r}); ONNX graphs are single-assignment"
                )
            produced[o] = idx
    order = _topological(graph, defined | outer, produced, where)
    if order != list(range(len(graph.node))):
        nodes = [graph.node[i] for i in order]
        del graph.node[:]
        graph.node.extend(nodes)
    visible = defined | outer | set(produced)
    for node in graph.node:
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                check_graph(
                    sub,
                    frozenset(visible),
                    f"{where} > {node.op_type} {node.name!r} attribute {attr.name!r}",
                )
    for out in graph.output:
        if out.name not in visible:
            raise InvalidGraph(f"{where}: output {out.name!r} is not produced by any node")


def _refuse_duplicate_inputs(graph: onnx.GraphProto, where: str) -> None:
    seen: set[str] = set()
    for value in graph.input:
        if value.name in seen:
            raise InvalidModel(
                f"{where}: input {value.name!r} is declared twice; graph input names must be "
                "unique (onnxruntime refuses this model too)"
            )
        seen.add(value.name)


def _topological(graph, available: set[str], produced: dict[str, int], where: str) -> list[int]:
    nodes = graph.node
    needs: list[set[str]] = []
    for node in nodes:
        req = {i for i in node.input if i}
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                req |= _free_names(sub)
        needs.append(req)
    for idx, req in enumerate(needs):
        for name in req:
            if name not in available and name not in produced:
                n = nodes[idx]
                raise InvalidGraph(
                    f"{where}: node {idx} {n.op_type} {n.name!r} reads {name!r}, "
                    "which no graph input, initializer or node defines"
                )
    order: list[int] = []
    done: set[int] = set()
    state: dict[int, int] = {}
    for start in range(len(nodes)):
        if start in done:
            continue
        stack = [(start, iter(sorted(needs[start])))]
        state[start] = 1
        while stack:
            idx, it = stack[-1]
            for name in it:
                dep = produced.get(name)
                if dep is None or dep in done or name in available:
                    continue
                if state.get(dep) == 1:
                    raise InvalidGraph(
                        f"{where}: the graph has a cycle through node {dep} "
                        f"{nodes[dep].op_type} {nodes[dep].name!r}"
                    )
                state[dep] = 1
                stack.append((dep, iter(sorted(needs[dep]))))
                break
            else:
                stack.pop()
                done.add(idx)
                order.append(idx)
    return order


def _free_names(graph: onnx.GraphProto) -> set[str]:
    defined = _graph_names(graph) | {o for n in graph.node for o in n.output}
    used: set[str] = set()
    for node in graph.node:
        used.update(i for i in node.input if i)
        for attr in node.attribute:
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                used |= _free_names(sub)
    used.update(o.name for o in graph.output)
    return used - defined


def check_model(proto: onnx.ModelProto) -> list[str]:
    """Versions, tensor data, structure and each node's op schema; raise on the first fault.

    What onnxruntime accepts as it is but onnxep reads in a normal form
    (negative dims, text that is not UTF-8, a domain used but not imported)
    is normalised in ``proto``; the returned load notes say what was.
    """
    notes: list[str] = []
    normalise_text(proto, notes)
    check_versions(proto)
    check_value_types(proto.graph, notes)
    check_attribute_fields(proto)
    if not proto.opset_import:
        raise InvalidGraph("the model imports no opset; add opset_import for the default domain")
    import_used_domains(proto, notes)
    check_tensor_data(proto)
    densify_sparse(proto.graph)
    check_graph(proto.graph)
    check_node_schemas(proto)
    return notes


def sparse_to_dense(sp: onnx.SparseTensorProto) -> onnx.TensorProto:
    """The dense tensor a SparseTensorProto stands for (indices linear or per-dim)."""
    import numpy as np
    from onnx import numpy_helper

    try:
        values = numpy_helper.to_array(sp.values)
        dims = tuple(sp.dims)
        dense = np.zeros(dims, dtype=values.dtype)
        if sp.indices.dims:
            idx = numpy_helper.to_array(sp.indices).astype(np.int64)
            if idx.ndim == 1:
                dense.reshape(-1)[idx] = values
            else:
                dense[tuple(idx.T)] = values
    except (ValueError, IndexError, TypeError, MemoryError) as exc:
        raise InvalidModel(
            f"sparse tensor {sp.values.name!r} (dims {list(sp.dims)}) is inconsistent: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    return numpy_helper.from_array(dense, sp.values.name)


def densify_sparse(graph: onnx.GraphProto) -> None:
    """Sparse initializers and Constant(sparse_value) become dense: onnx-ir cannot read them."""
    for sp in list(graph.sparse_initializer):
        graph.initializer.append(sparse_to_dense(sp))
    del graph.sparse_initializer[:]
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.SPARSE_TENSOR and node.op_type == "Constant":
                dense = sparse_to_dense(attr.sparse_tensor)
                attr.Clear()
                attr.name = "value"
                attr.type = onnx.AttributeProto.TENSOR
                attr.t.CopyFrom(dense)
            subs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                densify_sparse(sub)
