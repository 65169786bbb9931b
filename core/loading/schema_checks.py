"""Every node checked against its ONNX op schema: input and output counts, attributes.

onnxruntime checks every node against its op schema (``OpSchema::Verify``)
when it loads a model. This module does the same in Python, so that a bad
node is refused at session creation, naming the node, its op and opset,
instead of failing at the first run with a kernel's internal message. Ops
without an ONNX schema (custom domains, and default-domain ops such as
onnxruntime-genai's ``SimplifiedLayerNormalization``) are left to the
providers (design §4).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import onnx
import onnx.defs
from onnx import AttributeProto

from ..errors import InvalidModel
from .proto_checks import attribute_type_name, node_label, walk_nodes

_Param = onnx.defs.OpSchema.FormalParameterOption

#: Ops whose onnx schema accepts attributes it does not declare
#: (``AllowUncheckedAttributes``, which onnx does not expose to Python).
UNCHECKED_ATTRIBUTES = frozenset({("", "LayerNormalization")})


def canonical_domain(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


@functools.lru_cache(maxsize=4096)
def op_schema(op_type: str, version: int, domain: str) -> onnx.defs.OpSchema | None:
    """The schema of ``op_type`` at opset ``version`` of ``domain``, or None if onnx has none."""
    if not 1 <= version < 2**31:
        return None  # a custom domain's version outside what onnx can look up
    try:
        return onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return None


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
                f"attribute {attr.name!r} is {attribute_type_name(attr.type)} but the op declares "
                f"{attribute_type_name(want)}"
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
        for node, index, scope in walk_nodes(nodes, where):
            domain = canonical_domain(node.domain)
            if (node.domain, node.op_type) in local or domain not in opsets:
                continue
            schema = op_schema(node.op_type, opsets[domain], domain)
            if schema is None:
                continue  # no ONNX schema: the providers decide whether they can run it
            site = _Site(node, index, scope, opsets[domain], schema)
            _check_arity(site)
            _check_attributes(site)
