"""Imputer (ai.onnx.ml): replace ``replaced_value_*`` (NaN included) by the imputed value,
one for every column or one per column."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo


@kernel("Imputer", since=1, domain="ai.onnx.ml", dtypes=["float", "double", "int64", "int32"])
def imputer(node: NodeInfo, xp: Any):
    f_vals = node.attr("imputed_value_floats", None)
    i_vals = node.attr("imputed_value_int64s", None)
    if not f_vals and not i_vals:
        raise NotSupported("Imputer: imputed_value_floats or imputed_value_int64s must be set")
    f_vals = np.asarray(f_vals or [], np.float32)
    i_vals = np.asarray(i_vals or [], np.int64)
    f_repl = float(node.attr("replaced_value_float", 0.0))
    i_repl = int(node.attr("replaced_value_int64", 0))

    def run(x):
        x = np.asarray(x)
        floating = x.dtype.kind == "f"
        vals = f_vals if floating else i_vals
        if not vals.size:
            kind = "imputed_value_floats" if floating else "imputed_value_int64s"
            raise ValueError(f"Imputer: a {x.dtype} input needs {kind}")
        cols = x.shape[-1] if x.ndim else 1
        if vals.size not in (1, cols):
            raise ValueError(
                f"Imputer: {vals.size} imputed values for {cols} columns; give one, or one "
                "per column"
            )
        if floating:
            hit = np.isnan(x) if math.isnan(f_repl) else x == np.float32(f_repl)
        else:
            hit = x == i_repl
        fill = np.broadcast_to(vals.astype(x.dtype), x.shape if vals.size > 1 else ())
        return (np.where(hit, fill, x).astype(x.dtype),)

    return run
