"""CastMap (ai.onnx.ml): a map with int64 keys to a [1, n] tensor of its values, cast to
float, int64 or string; DENSE lays them out in key order, SPARSE at their keys' positions
(0 .. max_map - 1, the rest 0 or "0")."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from ._ml_common import enum_attr

_CAST = {"TO_FLOAT": 0, "TO_STRING": 1, "TO_INT64": 2}
_FORM = {"DENSE": 0, "SPARSE": 1}


@kernel("CastMap", since=1, domain="ai.onnx.ml")
def cast_map(node: NodeInfo, xp: Any):
    cast = enum_attr(node, "cast_to", _CAST, "TO_FLOAT")
    sparse = enum_attr(node, "map_form", _FORM, "DENSE") == 1
    max_map = int(node.attr("max_map", 1))

    def convert(v: Any) -> Any:
        if cast == 1:
            return v if isinstance(v, str) else _float_text(float(v))
        f = float(v)  # strings parse as numbers, as onnxruntime's std::stof does
        return np.float32(f) if cast == 0 else np.int64(f)

    dt = (np.float32, object, np.int64)[cast]

    def run(m):
        if not isinstance(m, dict):
            raise ValueError(f"CastMap: the input must be a map, got {type(m).__name__}")
        keys = sorted(m)
        if not sparse:
            vals = [convert(m[k]) for k in keys]
            return (np.array(vals, dtype=dt).reshape(1, len(vals)),)
        out = np.full(max_map, "0" if cast == 1 else 0, dtype=dt)
        for k in keys:
            if not 0 <= k < max_map:
                raise ValueError(f"CastMap: key {k} is outside 0..max_map-1 ({max_map - 1})")
            out[k] = convert(m[k])
        return (out.reshape(1, max_map),)

    return run


def _float_text(f: float) -> str:
    return repr(float(np.float32(f)))
