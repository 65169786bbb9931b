"""The model's IR version and opsets, against what the installed onnx knows.

onnxruntime refuses a model whose IR version or opset is newer than it knows;
so does onnxep, against the installed onnx (whose schemas and shape inference
it uses), naming both versions. Custom domains (``com.microsoft``...) version
themselves and are not limited.
"""

from __future__ import annotations

import onnx
import onnx.defs

from .errors import InvalidModel
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
