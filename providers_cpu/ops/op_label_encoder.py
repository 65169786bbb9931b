"""LabelEncoder (ai.onnx.ml): map each element through a key -> value table."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .misc import str_list, to_str

_NAN = object()  # the one dict key every NaN input maps to


def _norm_key(k: Any) -> Any:
    if isinstance(k, bytes):
        return k.decode("utf-8")
    if isinstance(k, float | np.floating) and math.isnan(float(k)):
        return _NAN
    if isinstance(k, np.generic):
        return k.item()
    return k


def _table(node: NodeInfo, kind: str) -> tuple[list, np.dtype | None]:
    """The ``keys_*`` or ``values_*`` list that is set, and its element dtype."""
    t = node.attr(f"{kind}_tensor", None)
    if t is not None:
        arr = np.asarray(t).reshape(-1)
        if arr.dtype == object or arr.dtype.kind in "SU":
            return str_list(arr), np.dtype(object)
        return arr.tolist(), arr.dtype
    for suffix, dt in (("strings", object), ("int64s", np.int64), ("floats", np.float32)):
        v = node.attr(f"{kind}_{suffix}", None)
        if v is not None:
            if dt is object:
                return str_list(v), np.dtype(object)
            # Float keys compare as the float32 values the input carries.
            return np.asarray(v, dtype=dt).tolist(), np.dtype(dt)
    raise NotSupported(f"LabelEncoder: no {kind}_* attribute is set")


def _default(node: NodeInfo, out_dt: np.dtype) -> Any:
    t = node.attr("default_tensor", None)
    if t is not None:
        v = np.asarray(t).reshape(-1)[0]
        return to_str(v) if out_dt.kind == "O" else v
    if out_dt.kind == "O":
        return to_str(node.attr("default_string", "_Unused"))
    if out_dt.kind == "f":
        return float(node.attr("default_float", -0.0))
    return int(node.attr("default_int64", -1))


@kernel("LabelEncoder", since=1, domain="ai.onnx.ml")
def label_encoder_v1(node: NodeInfo, xp: Any):
    classes = str_list(node.attr("classes_strings", None))
    if node.attr("default_string", None) is not None and node.input_dtype(0) != np.dtype(object):
        # int64 -> string: index into the classes.
        default = to_str(node.attr("default_string"))
        table = dict(enumerate(classes))
        out_dt = np.dtype(object)
    else:
        default = int(node.attr("default_int64", -1))
        table = {c: i for i, c in enumerate(classes)}
        out_dt = np.dtype(np.int64)
    return _mapper(table, default, out_dt)


@kernel("LabelEncoder", since=(2, 4), domain="ai.onnx.ml")
def label_encoder(node: NodeInfo, xp: Any):
    keys, _ = _table(node, "keys")
    values, out_dt = _table(node, "values")
    if len(keys) != len(values):
        raise NotSupported(
            f"LabelEncoder: {len(keys)} keys but {len(values)} values; they must pair up"
        )
    # Later duplicates win, as the spec asks.
    table = {_norm_key(k): v for k, v in zip(keys, values, strict=True)}
    return _mapper(table, _default(node, out_dt), out_dt)


def _mapper(table: dict, default: Any, out_dt: np.dtype):
    get = table.get

    def one(v: Any) -> Any:
        return get(_norm_key(v), default)

    fn = np.frompyfunc(one, 1, 1)

    def run(x):
        x = np.asarray(x)
        if x.size == 0:
            return (np.empty(x.shape, dtype=out_dt),)
        return (np.asarray(fn(x), dtype=object).astype(out_dt).reshape(x.shape),)

    return run
