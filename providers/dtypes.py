"""ONNX element types and the NumPy dtypes that carry them.

The extra float and sub-byte integer types come from ml_dtypes, the same
package onnx itself uses, so every tensor the ONNX test suite writes has a
dtype here.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import TensorProto

_ELEM_TO_NP: dict[int, np.dtype] = {
    TensorProto.FLOAT: np.dtype(np.float32),
    TensorProto.UINT8: np.dtype(np.uint8),
    TensorProto.INT8: np.dtype(np.int8),
    TensorProto.UINT16: np.dtype(np.uint16),
    TensorProto.INT16: np.dtype(np.int16),
    TensorProto.INT32: np.dtype(np.int32),
    TensorProto.INT64: np.dtype(np.int64),
    TensorProto.STRING: np.dtype(object),
    TensorProto.BOOL: np.dtype(np.bool_),
    TensorProto.FLOAT16: np.dtype(np.float16),
    TensorProto.DOUBLE: np.dtype(np.float64),
    TensorProto.UINT32: np.dtype(np.uint32),
    TensorProto.UINT64: np.dtype(np.uint64),
    TensorProto.COMPLEX64: np.dtype(np.complex64),
    TensorProto.COMPLEX128: np.dtype(np.complex128),
    TensorProto.BFLOAT16: np.dtype(ml_dtypes.bfloat16),
    TensorProto.FLOAT8E4M3FN: np.dtype(ml_dtypes.float8_e4m3fn),
    TensorProto.FLOAT8E4M3FNUZ: np.dtype(ml_dtypes.float8_e4m3fnuz),
    TensorProto.FLOAT8E5M2: np.dtype(ml_dtypes.float8_e5m2),
    TensorProto.FLOAT8E5M2FNUZ: np.dtype(ml_dtypes.float8_e5m2fnuz),
    TensorProto.UINT4: np.dtype(ml_dtypes.uint4),
    TensorProto.INT4: np.dtype(ml_dtypes.int4),
    TensorProto.FLOAT4E2M1: np.dtype(ml_dtypes.float4_e2m1fn),
}
for _name, _attr in (
    ("FLOAT8E8M0", "float8_e8m0fnu"),
    ("UINT2", "uint2"),
    ("INT2", "int2"),
    ("FLOAT6E2M3", "float6_e2m3fn"),
    ("FLOAT6E3M2", "float6_e3m2fn"),
):
    if hasattr(TensorProto, _name) and hasattr(ml_dtypes, _attr):
        _ELEM_TO_NP[getattr(TensorProto, _name)] = np.dtype(getattr(ml_dtypes, _attr))

_NP_TO_ELEM: dict[np.dtype, int] = {v: k for k, v in _ELEM_TO_NP.items()}

#: ONNX type names as they appear in ``tensor(float)``.
_ELEM_TO_NAME: dict[int, str] = {
    v: k.lower() for k, v in TensorProto.DataType.items() if k != "UNDEFINED"
}
_ELEM_TO_NAME[TensorProto.DOUBLE] = "double"
_NAME_TO_ELEM = {v: k for k, v in _ELEM_TO_NAME.items()}

FLOAT_TYPES = frozenset({"float", "float16", "double", "bfloat16"})
FLOAT8_TYPES = frozenset(
    n for n in _NAME_TO_ELEM if n.startswith("float8") or n.startswith("float4")
)
SIGNED_INT_TYPES = frozenset({"int8", "int16", "int32", "int64"})
UNSIGNED_INT_TYPES = frozenset({"uint8", "uint16", "uint32", "uint64"})
INT_TYPES = SIGNED_INT_TYPES | UNSIGNED_INT_TYPES
NUMERIC_TYPES = FLOAT_TYPES | INT_TYPES
ALL_TYPES = frozenset(_NAME_TO_ELEM)


def np_dtype(elem_type: int) -> np.dtype:
    """The NumPy dtype that carries ONNX element type ``elem_type``."""
    try:
        return _ELEM_TO_NP[elem_type]
    except KeyError:
        raise ValueError(f"ONNX element type {elem_type} has no NumPy dtype here") from None


def elem_type(dtype: np.dtype | type) -> int:
    """The ONNX element type of a NumPy dtype (``str_`` arrays count as strings)."""
    dt = np.dtype(dtype)
    if dt.kind in "UO":
        return TensorProto.STRING
    try:
        return _NP_TO_ELEM[dt]
    except KeyError:
        raise ValueError(f"NumPy dtype {dt} has no ONNX element type") from None


def type_name(elem: int) -> str:
    """``1 -> 'float'``: the name used inside ``tensor(...)``."""
    return _ELEM_TO_NAME.get(elem, f"elem{elem}")


def name_to_elem(name: str) -> int:
    return _NAME_TO_ELEM[name]


def dtype_name(dtype: np.dtype | type) -> str:
    """The ONNX type name of a NumPy dtype: ``float32 -> 'float'``."""
    return type_name(elem_type(dtype))
