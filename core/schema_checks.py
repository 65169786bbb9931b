"""Checking a model against what the installed onnx knows: versions and op schemas.

onnxruntime refuses a model whose IR version or opset is newer than it knows,
and checks every node against its op schema (``OpSchema::Verify``) when it
loads. This module does the same in Python so that a bad node is refused at
session creation, naming the node, its op and opset, instead of failing at the
first run with a kernel's internal message. Ops without an ONNX schema
(custom domains, and default-domain ops such as onnxruntime-genai's
``SimplifiedLayerNormalization``) are left to the providers (design §4).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass

import onnx
import onnx.defs
from onnx import AttributeProto

from .errors import InvalidModel

_Param = onnx.defs.OpSchema.FormalParameterOption

#: Ops whose onnx schema accepts attributes it does not declare
#: (``AllowUncheckedAttributes``, which onnx does not expose to Python).
UNCHECKED_ATTRIBUTES = frozenset({("", "LayerNormalization")})

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


def canonical_domain(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


def _domain_label(domain: str) -> str:
    return repr(domain) if domain else "the default ONNX domain ('')"


def newest_opsets() -> dict[str, int]:
    """The newest opset of each domain the installed onnx has schemas for."""
    # onnx.defs.onnx_opset_version() reads the same map for the default domain.
    return {domain: hi for domain, (_lo, hi) in onnx.defs.C.schema_version_map().items()}


def check_versions(proto: onnx.ModelProto) -> None:
    """Refuse an IR version or an ONNX-domain opset newer than the installed onnx knows."""
    if proto.ir_version > onnx.IR_VERSION:
        raise InvalidModel(
            f"the model has IR version {proto.ir_version}, but the installed onnx "
            f"{onnx.__version__} supports IR versions up to {onnx.IR_VERSION} (onnx.IR_VERSION); "
            "upgrade onnx or re-export the model with an older IR version"
        )
    newest = newest_opsets()
    imports = [("model", proto.opset_import)]
    imports += [(f"function {f.domain}:{f.name}", f.opset_import) for f in proto.functions]
    for where, opsets in imports:
        for op in opsets:
            domain = canonical_domain(op.domain)
            if domain not in newest:
                continue  # custom domains (com.microsoft, ...) version themselves
            if op.version < 1:
                raise InvalidModel(
                    f"the {where} imports opset {op.version} of {_domain_label(domain)}; "
                    "ONNX opsets start at 1"
                )
            if op.version > newest[domain]:
                raise InvalidModel(
                    f"the {where} imports opset {op.version} of {_domain_label(domain)}, but the "
                    f"installed onnx {onnx.__version__} knows opsets up to {newest[domain]} "
                    "(onnx.defs.onnx_opset_version()); upgrade onnx or re-export the model "
                    "with an older opset"
                )


@functools.lru_cache(maxsize=4096)
def op_schema(op_type: str, version: int, domain: str) -> onnx.defs.OpSchema | None:
    """The schema of ``op_type`` at opset ``version`` of ``domain``, or None if onnx has none."""
    if not 1 <= version < 2**31:
        return None  # a custom domain's version outside what onnx can look up
    try:
        return onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return None


def node_label(node: onnx.NodeProto, index: int, where: str = "") -> str:
    """``Add node 'add'``, or ``Add node 'Add_3'`` for an unnamed node (as placement names it)."""
    name = f"{node.op_type} node {node.name or f'{node.op_type}_{index}'!r}"
    return f"{name} in {where}" if where else name


@dataclass(frozen=True)
class _Site:
    """A node, where it sits, the opset it was read at and the schema that opset gives."""

    node: onnx.NodeProto
    index: int
    where: str
    opset: int
    schema: onnx.defs.OpSchema

    def fail(self, what: str) -> InvalidModel:
        s = self.schema
        domain = f"domain {s.domain!r}, " if s.domain else ""
        return InvalidModel(
            f"{node_label(self.node, self.index, self.where)} ({domain}opset {self.opset}, "
            f"schema {s.name}-{s.since_version}): {what}"
        )


def _check_arity(site: _Site) -> None:
    node, schema = site.node, site.schema
    for kind, given, lo, hi, params in (
        ("input", list(node.input), schema.min_input, schema.max_input, schema.inputs),
        ("output", list(node.output), schema.min_output, schema.max_output, schema.outputs),
    ):
        if not lo <= len(given) <= hi:
            allowed = f"exactly {lo}" if lo == hi else f"{lo} to {hi}"
            if hi >= 2**31 - 1:
                allowed = f"at least {lo}"
            plural = "" if len(given) == 1 else "s"
            raise site.fail(f"has {len(given)} {kind}{plural}; the op takes {allowed}")
        for idx, name in enumerate(given):
            if idx >= len(params):
                break  # the last parameter is variadic (the count check passed)
            if not name and params[idx].option == _Param.Single:
                raise site.fail(f"{kind} {idx} ({params[idx].name}) is required but left empty")


def _check_attributes(site: _Site) -> None:
    node, schema = site.node, site.schema
    declared = schema.attributes
    seen: set[str] = set()
    unchecked = (schema.domain, schema.name) in UNCHECKED_ATTRIBUTES
    for attr in node.attribute:
        if attr.name in seen:
            raise site.fail(f"attribute {attr.name!r} is given twice")
        seen.add(attr.name)
        if attr.name.startswith("__"):
            continue  # onnx reserves double-underscore names for implementations
        spec = declared.get(attr.name)
        if spec is None:
            if unchecked:
                continue
            known = ", ".join(sorted(declared)) or "none"
            raise site.fail(f"unknown attribute {attr.name!r} (the op's attributes: {known})")
        want = int(spec.type.value)
        if attr.type != want:
            raise site.fail(
                f"attribute {attr.name!r} is {_type_name(attr.type)} but the op declares "
                f"{_type_name(want)}"
            )
        if not _utf8([attr.s] if want == AttributeProto.STRING else list(attr.strings)):
            # ONNX ops' string attributes are text (custom ops may carry binary blobs).
            raise site.fail(f"attribute {attr.name!r} is not valid UTF-8 text")
    for name, spec in declared.items():
        if spec.required and name not in seen:
            raise site.fail(f"required attribute {name!r} is missing")


def _utf8(values: list[bytes]) -> bool:
    try:
        for v in values:
            v.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


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
        if attr.type == AttributeProto.UNDEFINED or attr.type not in _TYPE_NAMES:
            raise InvalidModel(f"{label} has no valid type ({_type_name(attr.type)})")
        used = [f for f in _SINGULAR_FIELDS if attr.HasField(f)]
        used += [f for f in _REPEATED_FIELDS if len(getattr(attr, f))]
        if len(used) > 1:
            raise InvalidModel(f"{label} sets several value fields ({', '.join(used)})")
        for field in used:
            kind = _SINGULAR_FIELDS.get(field, _REPEATED_FIELDS.get(field))
            if kind != attr.type:
                raise InvalidModel(
                    f"{label} is {_type_name(attr.type)} but sets the {_type_name(kind)} "
                    f"field {field!r}"
                )
        field = _MESSAGE_FIELD.get(attr.type)
        if field is not None and not attr.HasField(field):
            raise InvalidModel(f"{label} is {_type_name(attr.type)} but has no value")


_TYPE_NAMES = frozenset(AttributeProto.AttributeType.values())


def _type_name(attr_type: int) -> str:
    try:
        return AttributeProto.AttributeType.Name(attr_type)
    except ValueError:
        return f"type {attr_type}"


def check_node_schemas(proto: onnx.ModelProto) -> None:
    """Every node with an ONNX schema has that schema's arity and attributes.

    Nodes in subgraphs and in model-local functions are checked too, each with
    the opsets of the model or function that holds it.
    """
    local = {(f.domain, f.name) for f in proto.functions}
    model_opsets = {canonical_domain(o.domain): o.version for o in proto.opset_import}
    bodies = [(proto.graph.node, model_opsets, f"graph {proto.graph.name!r}")]
    for f in proto.functions:
        opsets = {canonical_domain(o.domain): o.version for o in f.opset_import}
        bodies.append((f.node, opsets, f"function {f.domain}:{f.name}"))
    for nodes, opsets, where in bodies:
        for node, index, scope in _walk(nodes, where):
            _check_attribute_fields(node, index, scope)
            domain = canonical_domain(node.domain)
            if (node.domain, node.op_type) in local or domain not in opsets:
                continue
            schema = op_schema(node.op_type, opsets[domain], domain)
            if schema is None:
                continue  # no ONNX schema: the providers decide whether they can run it
            site = _Site(node, index, scope, opsets[domain], schema)
            _check_arity(site)
            _check_attributes(site)


def _walk(nodes, where: str) -> Iterator[tuple[onnx.NodeProto, int, str]]:
    for index, node in enumerate(nodes):
        yield node, index, where
        for attr in node.attribute:
            subs = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)
            for sub in subs:
                inner = f"{where} > {node.op_type} {node.name!r} attribute {attr.name!r}"
                yield from _walk(sub.node, inner)
