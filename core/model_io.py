"""Input and output descriptions (``get_inputs``), and checking feeds against them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import onnx_ir as ir

from onnxep.providers.dtypes import dtype_name, np_dtype

from .errors import InvalidArgument
from .loading.map_types import MapType


def _elem_name(dtype: Any) -> str:
    try:
        return dtype_name(np_dtype(int(dtype)))
    except ValueError:
        return "undefined"


def tensor_dtype(type_str: str) -> np.dtype:
    """The NumPy dtype of a ``tensor(float)``-style type string (the inverse of type_string)."""
    from onnxep.providers.dtypes import name_to_elem

    inner = type_str[len("tensor(") : -1] if type_str.startswith("tensor(") else type_str
    try:
        return np_dtype(name_to_elem(inner))
    except (KeyError, ValueError):
        # e.g. tensor(undefined): a model that declares no element type for a value
        raise InvalidArgument(f"{type_str} names no element type a NumPy array can hold") from None


def type_string(t: Any) -> str:
    if t is None:
        return "unknown"
    if isinstance(t, ir.TensorType):
        return f"tensor({_elem_name(t.dtype)})"
    if isinstance(t, ir.SequenceType):
        return f"seq({type_string(t.elem_type)})"
    if isinstance(t, ir.OptionalType):
        return f"optional({type_string(t.elem_type)})"
    if isinstance(t, ir.SparseTensorType):
        return f"sparse_tensor({_elem_name(t.dtype)})"
    if isinstance(t, MapType):
        return f"map({_elem_name(t.key)},{type_string(t.value)})"
    return str(t)


@dataclass(frozen=True)
class NodeArg:
    """An input or output as ``get_inputs()`` shows it: name, shape, ``tensor(float)`` type."""

    name: str
    shape: list[int | str | None] | None
    type: str

    @staticmethod
    def of(value: ir.Value) -> NodeArg:
        shape = None
        if value.shape is not None:
            shape = [
                d if isinstance(d, int) else getattr(d, "value", None) for d in value.shape.dims
            ]
        return NodeArg(value.name or "", shape, type_string(value.type))


def python_to_array(feed: Any, dtype: np.dtype | None, name: str, declared: str) -> np.ndarray:
    """A Python list, tuple or scalar as an array of the input's declared dtype.

    As onnxruntime does, the values take the declared type rather than NumPy's
    default float64/int64; a value the type cannot hold exactly (1.5 for an
    integer input, 300 for uint8, 2 for bool, a float beyond float16's range)
    is refused rather than rounded, wrapped or made infinite.
    """
    try:
        arr = np.asarray(feed)
    except (ValueError, TypeError) as exc:
        raise InvalidArgument(
            f"input {name!r}: the {type(feed).__name__} given cannot be made into an array "
            f"(nested lists must all have the same length): {exc}"
        ) from None
    if dtype is None:
        return arr
    if dtype == np.dtype(object):
        if arr.dtype.kind in "US" or (arr.dtype == object and arr.size == 0):
            return arr.astype(object)
        raise InvalidArgument(f"input {name!r} is {declared}; give it strings, not {arr.dtype}")
    if arr.dtype.kind not in "biufc" or (arr.dtype.kind == "c" and dtype.kind != "c"):
        raise InvalidArgument(
            f"input {name!r} is {declared}; the values given ({arr.dtype}) cannot convert "
            f"to {dtype}"
        )
    with np.errstate(all="ignore"):
        out = arr.astype(dtype)
        if _is_integer(dtype):
            lost = out.astype(arr.dtype) != arr
        else:
            # Floats round; only values that turn infinite (or NaN) are refused.
            lost = np.isfinite(out) != np.isfinite(arr)
    if lost.any():
        value = arr[lost].flat[0].item()
        raise InvalidArgument(
            f"input {name!r} is {declared}, but the value {value!r} given cannot be represented "
            f"as {dtype}; pass an array of the declared type to convert it yourself"
        )
    return out


def _is_integer(dtype: np.dtype) -> bool:
    if dtype.kind in "biu":
        return True
    try:
        ml_dtypes.iinfo(dtype)  # int4, uint4, int2, uint2
    except (ValueError, TypeError):
        return False
    return True


def is_device_array(x: Any) -> bool:
    """Whether ``x`` lives in device memory (CUDA array interface, or DLPack off the CPU)."""
    if hasattr(x, "__cuda_array_interface__"):
        return True
    probe = getattr(x, "__dlpack_device__", None)
    if probe is None:
        return False
    try:
        return int(probe()[0]) != 1  # kDLCPU
    except Exception:
        return False


def host_array(x: Any, name: str = "") -> np.ndarray:
    """A NumPy view of a host array from another library (DLPack or the array interface)."""
    if isinstance(x, np.ndarray):
        return x
    try:
        if hasattr(x, "__dlpack__"):
            return np.from_dlpack(x)
        return np.asarray(x)
    except (TypeError, ValueError, BufferError, RuntimeError) as exc:
        what = f"input {name!r}" if name else "the array"
        raise InvalidArgument(
            f"{what} is a {type(x).__name__} that NumPy cannot read ({exc}); pass a NumPy "
            "array (for a torch tensor: .detach().cpu().numpy())"
        ) from None


#: how many (dtype, shape) pairs a feed check remembers per input
PASSED_KEYS = 64


class FeedCheck:
    """Checks one graph input's feed: kind, dtype, rank, and the dims the model fixes."""

    def __init__(self, value: ir.Value) -> None:
        self.name = value.name or ""
        self.arg = NodeArg.of(value)
        t = value.type
        self.tensor = isinstance(t, ir.TensorType)
        self.dtype = None
        if self.tensor:
            try:
                self.dtype = np_dtype(int(t.dtype))
            except ValueError:
                self.dtype = None  # undeclared element type: the kernels check it
        self.shape = self.arg.shape if self.tensor else None
        #: the dims the model fixes, (axis, size): checked on every run, so listed once here
        self.fixed = tuple(
            (axis, want)
            for axis, want in enumerate(self.shape or ())
            if isinstance(want, int) and want >= 0
        )
        self.map = _map_check(t, self.name, self.arg.type)
        #: (dtype, shape) pairs of arrays that passed as they were: a feed of one of them
        #: passes without the checks below (a model is run on a few shapes, over and over)
        self.passed: dict[tuple[np.dtype, tuple[int, ...]], None] = {}
        #: the last of them, its dtype as the object itself: a feed whose dtype *is* that
        #: object passes without hashing or comparing dtypes (0.2-0.3 us a feed)
        self._last: tuple[Any, Any] = (None, None)

    def __call__(self, feed: Any) -> Any:
        if feed.__class__ is np.ndarray:
            dtype, shape = self._last
            if feed.dtype is dtype and feed.shape == shape:
                return feed
            if (feed.dtype, feed.shape) in self.passed:
                self._last = (feed.dtype, feed.shape)
                return feed
        if self.map is not None:
            return self.map(feed)
        if not self.tensor:
            return feed
        if not isinstance(feed, np.ndarray):
            if isinstance(feed, np.generic):
                feed = np.asarray(feed)  # a NumPy scalar has a dtype: checked like an array
            elif isinstance(feed, (list, tuple, int, float, bool, complex, str)):
                feed = python_to_array(feed, self.dtype, self.name, self.arg.type)
            elif is_device_array(feed):
                return feed  # a device array; its provider checks it
            elif hasattr(feed, "__dlpack__") or hasattr(feed, "__array__"):
                feed = host_array(feed, self.name)  # a torch CPU tensor, say: no copy
            else:
                raise InvalidArgument(
                    f"input {self.name!r} must be a numpy array, got {type(feed).__name__}"
                )
        if self.dtype is not None and feed.dtype != self.dtype:
            if self.dtype == np.dtype(object) and feed.dtype.kind == "U":
                feed = feed.astype(object)
            else:
                raise InvalidArgument(
                    f"input {self.name!r} has dtype {feed.dtype} but the model declares "
                    f"{self.arg.type} ({self.dtype}); convert it with .astype(np.{self.dtype})"
                )
        if self.shape is not None:
            if feed.ndim != len(self.shape):
                raise InvalidArgument(
                    f"input {self.name!r} has rank {feed.ndim} (shape {list(feed.shape)}) but the "
                    f"model declares rank {len(self.shape)} (shape {self.shape})"
                )
            got_shape = feed.shape
            for axis, want in self.fixed:
                got = got_shape[axis]
                if want != got:
                    raise InvalidArgument(
                        f"input {self.name!r} has {got} at dim {axis} (shape "
                        f"{list(feed.shape)}) but the model fixes it to {want} (shape {self.shape})"
                    )
        if feed.__class__ is np.ndarray and len(self.passed) < PASSED_KEYS:
            self.passed[feed.dtype, feed.shape] = None
            self._last = (feed.dtype, feed.shape)
        return feed


def _map_check(t: Any, name: str, declared: str) -> Any:
    """The check of a ``map(K, V)`` or ``seq(map(K, V))`` input, or None for other types."""
    seq = isinstance(t, ir.SequenceType)
    m = t.elem_type if seq else t
    if not isinstance(m, MapType):
        return None
    string_keys = m.key == ir.DataType.STRING
    try:
        value_dt = np_dtype(int(m.dtype))
    except ValueError:
        value_dt = None

    def one(d: Any, where: str) -> dict:
        if not isinstance(d, Mapping):
            raise InvalidArgument(
                f"input {name!r} is {declared}; {where} must be a dict, got {type(d).__name__}"
            )
        out = {}
        for k, v in d.items():
            if string_keys:
                if isinstance(k, bytes):
                    k = k.decode("utf-8")
                if not isinstance(k, str):
                    raise InvalidArgument(
                        f"input {name!r} is {declared}; key {k!r} of {where} is not a string"
                    )
            else:
                if isinstance(k, (bool, np.bool_)) or not isinstance(k, (int, np.integer)):
                    raise InvalidArgument(
                        f"input {name!r} is {declared}; key {k!r} of {where} is not an integer"
                    )
                k = int(k)
            if value_dt is not None and value_dt.kind in "fiu":
                if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.number)):
                    raise InvalidArgument(
                        f"input {name!r} is {declared}; the value of key {k!r} in {where} is "
                        f"{type(v).__name__}, not a number"
                    )
                v = value_dt.type(v).item()
            elif value_dt is not None and value_dt.kind == "O" and isinstance(v, bytes):
                v = v.decode("utf-8")
            out[k] = v
        return out

    def check(feed: Any) -> Any:
        if not seq:
            return one(feed, "the feed")
        if not isinstance(feed, (list, tuple)):
            raise InvalidArgument(
                f"input {name!r} is {declared}; feed a list of dicts, got {type(feed).__name__}"
            )
        return [one(d, f"element {i}") for i, d in enumerate(feed)]

    return check
