"""Cast and CastLike on the CPU: the generic kernels plus string tensors (object arrays)."""

from __future__ import annotations

import math

import numpy as np

from onnxep.providers.kernel import kernel
from onnxep.providers.ops import op_cast, op_cast_like
from onnxep.providers.ops.elementwise import F64, cast_numeric, onnx_to_dtype

#: element types whose casts among themselves are NumPy's astype in every ONNX rule
_PLAIN = frozenset(
    np.dtype(t)
    for t in (
        np.bool_, np.int8, np.int16, np.int32, np.int64,
        np.uint8, np.uint16, np.uint32, np.uint64, np.float16, np.float32, np.float64,
    )
)  # fmt: skip

# The literals the Cast spec reserves for the special float values.
_SPECIAL = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def _text(s) -> str:
    return s.decode() if isinstance(s, bytes) else str(s)


def _parse_float(s) -> float:
    t = _text(s).strip()
    special = _SPECIAL.get(t.lower())
    return float(t) if special is None else special


def _parse_int(s) -> int:
    t = _text(s).strip()
    try:
        return int(t)
    except ValueError:
        # "100.5" to an integer is undefined by the spec; truncating is the usual answer.
        return int(_parse_float(t))


def _format(v) -> str:
    if isinstance(v, (float, np.floating)):
        f = float(v)
        if math.isnan(f):
            return "NaN"
        if math.isinf(f):
            return "INF" if f > 0 else "-INF"
    return str(v)


def from_strings(x: np.ndarray, to: np.dtype, saturate: bool, mode: str) -> np.ndarray:
    flat = x.ravel()
    if to.kind in "OUS":
        return x.astype(object)
    if to.kind in "iu":
        vals = np.array([_parse_int(s) for s in flat], dtype=object)
        return vals.astype(to).reshape(x.shape)
    if to.kind == "b":
        vals = np.array([_parse_float(s) != 0 for s in flat], dtype=bool)
        return vals.reshape(x.shape)
    vals = np.array([_parse_float(s) for s in flat], dtype=F64).reshape(x.shape)
    return cast_numeric(np, vals, to, saturate, mode)


def to_strings(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind not in "biuf":
        # Narrow floats and sub-byte ints print through the types NumPy knows.
        x = x.astype(np.float32) if "float" in x.dtype.name else x.astype(np.int64)
    out = np.empty(x.shape, dtype=object)
    # Iterating NumPy scalars (not .tolist()) prints float32 at its own precision.
    out.reshape(-1)[:] = [_format(v) for v in x.reshape(-1)]
    return out


def _convert(x, to, saturate, mode):
    if x.dtype.kind in "OUS":
        return from_strings(x, to, saturate, mode)
    if to.kind in "OUS":
        return to_strings(x)
    return cast_numeric(np, x, to, saturate, mode)


@kernel("Cast", since=op_cast.CAST_VERSIONS)
def cast(node, xp):
    to = onnx_to_dtype(node.attr("to"))
    saturate, mode = op_cast.cast_options(node)
    plain = to in _PLAIN

    def run(x):
        src = x.dtype
        if src == to:
            return (x,)
        # Between NumPy's own numeric types a Cast is astype (cast_numeric's answer after
        # its eight checks for float8, bfloat16 and sub-byte types: 1.5 us a node).
        if plain and src in _PLAIN:
            return (x.astype(to),)
        return (_convert(x, to, saturate, mode),)

    return run


@kernel("CastLike", since=op_cast_like.CAST_LIKE_VERSIONS)
def cast_like(node, xp):
    saturate, mode = op_cast.cast_options(node)

    def run(x, like):
        return (_convert(x, like.dtype, saturate, mode),)

    return run
