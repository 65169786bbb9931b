"""The model's IR version and opsets, against what the installed onnx knows.

onnxruntime refuses a model whose IR version or opset is newer than it knows;
so does onnxep, against the installed onnx (whose schemas and shape inference
it uses), naming both versions. Custom domains (``com.microsoft``...) version
themselves and are not limited.

A node whose domain the model does not import is read as onnxruntime reads
it, when the domain is one onnxruntime knows: at that domain's newest opset
(the installed onnx's for ONNX domains, 1 for onnxruntime's own), imported
into the model with a load note. Any other domain is refused, as onnxruntime
refuses it.
"""

from __future__ import annotations

import onnx
import onnx.defs

from .errors import InvalidGraph, InvalidModel
from .proto_checks import walk_nodes
from .schema_checks import canonical_domain


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


#: onnxruntime's own domains and the one opset each has; the ONNX domains come from onnx.
RUNTIME_DOMAINS = {"com.microsoft": 1, "com.microsoft.nchwc": 1}


def import_used_domains(proto: onnx.ModelProto, notes: list[str]) -> None:
    """Import each domain a node uses without an import, where onnxruntime would (module doc)."""
    imported = {canonical_domain(op.domain) for op in proto.opset_import}
    local = {(f.domain, f.name) for f in proto.functions}
    known = {**newest_opsets(), **RUNTIME_DOMAINS}
    users: dict[str, list[str]] = {}
    for node, _, _ in walk_nodes(proto.graph.node, ""):
        domain = canonical_domain(node.domain)
        if domain in imported or (node.domain, node.op_type) in local:
            continue
        if domain not in known:
            raise InvalidGraph(
                f"node {node.op_type} {node.name!r} uses domain {node.domain!r}, which the model "
                "does not import (add it to opset_import; onnxruntime refuses this model too)"
            )
        users.setdefault(domain, []).append(node.op_type)
    for domain, ops in users.items():
        proto.opset_import.append(onnx.helper.make_opsetid(domain, known[domain]))
        notes.append(
            f"{len(ops)} node(s) ({', '.join(sorted(set(ops)))}) use {_domain_label(domain)}, "
            f"which the model does not import; read at its opset {known[domain]}, "
            "as onnxruntime does"
        )
