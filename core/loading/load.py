"""The loading stage: a model read, checked, shape-inferred and made an onnx-ir model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import onnx

from ..errors import InvalidGraph, with_cause
from .axis_checks import check_axes
from .map_types import restore_map_types, strip_map_types
from .read import ModelLike, check_model, load_external_data, read_model

__all__ = ["Loaded", "load"]


@dataclass
class Loaded:
    """What the later stages start from: the IR model, and the proto it was read from."""

    model: object  # onnx_ir.Model
    proto: onnx.ModelProto  # shape-inferred; its metadata is the session's get_modelmeta
    path: Path | None
    notes: list[str]


def load(model: ModelLike, free_dimension_overrides: Mapping[str, int]) -> Loaded:
    """Read and check ``model``, size its named free dims, infer shapes, convert to IR."""
    loaded = read_model(model)
    notes: list[str] = check_model(loaded.proto)
    _override_free_dims(loaded.proto, free_dimension_overrides)
    proto = _infer_shapes(loaded.proto)
    check_axes(proto)
    loaded.proto = proto
    load_external_data(loaded, notes)
    return Loaded(_to_ir(proto), proto, loaded.path, notes)


def _infer_shapes(proto: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception:
        return proto  # shapes only help kernels pick; the run does not depend on them


def _override_free_dims(proto: onnx.ModelProto, overrides: Mapping[str, int]) -> None:
    """SessionOptions.add_free_dimension_override_by_name: a named dim becomes that size."""
    if not overrides:
        return
    for value in proto.graph.input:
        if value.type.WhichOneof("value") != "tensor_type":
            continue
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in overrides:
                dim.dim_value = overrides[dim.dim_param]


def _to_ir(proto: onnx.ModelProto):
    import onnx_ir as ir

    # onnx-ir has no map types: they are taken off before and put back after (map_types).
    proto, maps = strip_map_types(proto)
    try:
        model = ir.serde.deserialize_model(proto)
    except Exception as exc:
        raise InvalidGraph(f"the model could not be read into onnx-ir: {with_cause(exc)}") from exc
    restore_map_types(model, maps)
    if model.functions:
        ir.passes.common.InlinePass()(model)
    return model
