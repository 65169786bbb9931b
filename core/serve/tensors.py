"""Named tensors in and out of an HTTP body: JSON with dtype and shape, or an ``.npz`` file.

Nothing a client sends is unpickled or evaluated. JSON is parsed by the
standard library into lists of numbers, booleans and strings, and each tensor
is built from them with the dtype it names, checked leaf kind by leaf kind (a
string is not a number, a float is not an integer, an integer must fit its
type). An ``.npz`` body is read with ``np.load(..., allow_pickle=False)``
after every member's header has been read and checked: plain numeric, boolean
or string dtypes only, and data the size its shape says, within the body
limit once unpacked (a compressed member cannot expand past it).

A JSON tensor is ``{"dtype": "float32", "shape": [2, 3], "data": [[...], [...]]}``:
``data`` nested as the shape says, or flat with as many values; ``shape``
may be left out (the nesting gives it). Float values that are not finite are
the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``, both ways, as
protobuf's JSON mapping writes them, so a response is strict JSON and reads
back to the same bits.
"""

from __future__ import annotations

import io
import json
import math
import zipfile
from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from .limits import BAD_REQUEST, NOT_ACCEPTABLE, TOO_LARGE, Limits, RequestError, over_limit

#: the dtype names a JSON tensor may give, and the arrays they make
DTYPES: dict[str, np.dtype] = {
    name: np.dtype(name)
    for name in (
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
    )
}
DTYPES["bfloat16"] = np.dtype(ml_dtypes.bfloat16)
DTYPES["string"] = np.dtype(object)

_SPECIAL = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
_MAX_RANK = 32
NPZ_TYPES = ("application/x-npz", "application/npz", "application/zip", "application/octet-stream")


def _bad(message: str) -> RequestError:
    return RequestError(BAD_REQUEST, message)


def _dtype_name(dtype: np.dtype) -> str:
    if dtype == np.dtype(object) or dtype.kind == "U":
        return "string"
    if dtype == DTYPES["bfloat16"]:
        return "bfloat16"
    return dtype.name


# -- JSON -----------------------------------------------------------------------------------
def parse_json(body: bytes) -> Any:
    """The body as JSON, or a 400 saying why it is not."""
    try:
        return json.loads(body)
    except RecursionError:
        raise _bad("the JSON body is nested too deeply to read") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise _bad(f"the request body is not valid JSON ({exc})") from None


def _with_specials(name: str, data: Any, depth: int = 0) -> Any:
    """``data`` with the non-finite float strings turned into floats; any other string is an
    error (a string is not a number)."""
    if depth > _MAX_RANK:
        raise _bad(f"input {name!r}: data is nested deeper than {_MAX_RANK} levels")
    if isinstance(data, list):
        return [_with_specials(name, v, depth + 1) for v in data]
    if isinstance(data, str):
        if data in _SPECIAL:
            return _SPECIAL[data]
        raise _bad(
            f"input {name!r}: {data!r:.40} is not a number (non-finite floats are written "
            '"NaN", "Infinity", "-Infinity")'
        )
    return data


def _all_strings(data: Any, depth: int = 0) -> bool:
    if depth > _MAX_RANK:
        return False
    if isinstance(data, list):
        return all(_all_strings(v, depth + 1) for v in data)
    return isinstance(data, str)


def _leaves(name: str, data: Any) -> np.ndarray:
    try:
        return np.array(data)
    except (ValueError, TypeError, OverflowError) as exc:
        raise _bad(
            f"input {name!r}: data cannot be read as an array; nested lists must all have the "
            f"same length ({str(exc).splitlines()[0]:.120})"
        ) from None


def tensor_from_json(name: str, obj: Any) -> np.ndarray:
    """One input from its JSON object ``{"dtype", "shape", "data"}``."""
    if not isinstance(obj, Mapping) or "data" not in obj or "dtype" not in obj:
        raise _bad(
            f'input {name!r} must be an object {{"dtype": ..., "shape": [...], "data": [...]}}, '
            f"got {json.dumps(obj)[:60]}"
        )
    extra = sorted(set(obj) - {"dtype", "shape", "data"})
    if extra:
        raise _bad(f"input {name!r} has unknown field(s) {', '.join(map(repr, extra))}")
    dname = obj["dtype"]
    if not isinstance(dname, str) or dname not in DTYPES:
        raise _bad(f"input {name!r}: dtype {dname!r} is not one of {', '.join(DTYPES)}")
    dtype = DTYPES[dname]
    shape = obj.get("shape")
    if shape is not None:
        if (
            not isinstance(shape, list)
            or len(shape) > _MAX_RANK
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
        ):
            raise _bad(f"input {name!r}: shape must be a list of whole numbers >= 0, got {shape}")
    data = obj["data"]
    if dname == "string":
        if not _all_strings(data):
            raise _bad(f"input {name!r} is a string tensor; every value must be a JSON string")
        arr = _leaves(name, data).astype(object)
    else:
        arr = _leaves(name, data)
        floats = dtype.kind == "f" or dtype == DTYPES["bfloat16"]
        if arr.dtype.kind in "UO" and floats:
            arr = _leaves(name, _with_specials(name, data))
        arr = _typed(name, arr, dtype, dname, data)
    if shape is not None and list(arr.shape) != shape:
        size = math.prod(shape)
        if arr.ndim != 1 or arr.size != size:
            raise _bad(
                f"input {name!r}: data has shape {list(arr.shape)} ({arr.size} values), but "
                f"shape says {shape} ({size} values); nest the data as the shape says, or give "
                "it flat"
            )
        arr = arr.reshape(shape)
    return arr


def _first_not(data: Any, ok: Any, depth: int = 0) -> Any:
    """The first leaf of ``data`` that ``ok`` refuses, or ``ok`` itself when there is none."""
    if isinstance(data, list) and depth <= _MAX_RANK:
        for v in data:
            bad = _first_not(v, ok, depth + 1)
            if bad is not ok:
                return bad
        return ok
    return ok if ok(data) else data


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_ACCEPT = {
    "true or false": lambda v: isinstance(v, bool),
    "whole numbers": _is_int,
    "numbers": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
}


def _typed(name: str, arr: np.ndarray, dtype: np.dtype, dname: str, data: Any = None) -> np.ndarray:
    """``arr`` (as NumPy read the JSON leaves ``data``) as ``dtype``, refusing a leaf of
    another kind or a value the dtype cannot hold."""
    if arr.size == 0:
        return arr.astype(dtype)
    kind = arr.dtype.kind
    if dtype.kind in "iu" and kind not in "iu" and data is not None:
        # ints past int64 next to small ones read as float64 (or objects): exact, by Python
        bad = _first_not(data, _is_int)
        if bad is _is_int:
            arr, kind = np.array(data, dtype=object), "i"
    if dtype.kind == "b":
        ok = kind == "b"
        want = "true or false"
    elif dtype.kind in "iu":
        ok = kind in "iu"
        want = "whole numbers"
    else:  # floats, bfloat16 among them (kind "V" in NumPy)
        ok = kind in "iuf"
        want = "numbers"
    if not ok:
        sample = arr.reshape(-1)[0].item() if data is None else _first_not(data, _ACCEPT[want])
        raise _bad(f"input {name!r} is {dname}: its values must be {want}, got {sample!r:.40}")
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        low, high = int(arr.min()), int(arr.max())
        if low < info.min or high > info.max:
            bad = low if low < info.min else high
            raise _bad(f"input {name!r}: {bad} does not fit {dname} ({info.min} to {info.max})")
        return arr.astype(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        out = arr.astype(dtype)
        lost = np.isfinite(out.astype(np.float64)) != np.isfinite(arr.astype(np.float64))
    if lost.any():
        value = arr[lost].reshape(-1)[0].item()
        raise _bad(f"input {name!r}: {value!r} is too large for {dname}")
    return out


def feeds_from_json(body: bytes) -> tuple[dict[str, np.ndarray], list[str] | None]:
    """The feeds, and the outputs asked for (None: all), from a JSON /infer body:
    ``{"inputs": {name: tensor, ...}, "outputs": [name, ...]}``."""
    doc = parse_json(body)
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), dict):
        raise _bad(
            'the JSON body must be an object {"inputs": {"NAME": {"dtype": ..., "shape": '
            '[...], "data": [...]}}, "outputs": [...]} ("outputs" may be left out)'
        )
    extra = sorted(set(doc) - {"inputs", "outputs"})
    if extra:
        raise _bad(f"the JSON body has unknown field(s) {', '.join(map(repr, extra))}")
    outputs = doc.get("outputs")
    if outputs is not None and (
        not isinstance(outputs, list) or not all(isinstance(n, str) for n in outputs)
    ):
        raise _bad('"outputs" must be a list of output names')
    feeds = {name: tensor_from_json(name, obj) for name, obj in doc["inputs"].items()}
    return feeds, outputs


def _json_value(value: Any) -> Any:
    """An output as JSON: a tensor as ``{"dtype", "shape", "data"}``; a sequence (of maps,
    from a classifier's ZipMap) and a map as lists and objects of the same."""
    if isinstance(value, np.ndarray):
        return tensor_to_json(value)
    if isinstance(value, np.generic):
        return _json_value(np.asarray(value))["data"]
    if isinstance(value, Mapping):
        return {"dtype": "map", "data": {str(k): _plain(v) for k, v in value.items()}}
    if isinstance(value, list | tuple):
        return {"dtype": "sequence", "data": [_plain(v) for v in value]}
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, np.ndarray | Mapping | list | tuple):
        return _json_value(value)
    return value


def tensor_to_json(arr: np.ndarray) -> dict[str, Any]:
    name = _dtype_name(arr.dtype)
    if arr.dtype.kind in "OU":
        data = arr.astype(str).tolist()
    elif arr.dtype.kind == "f" or arr.dtype == DTYPES["bfloat16"]:
        wide = arr.astype(np.float64)  # exact for every float type; tolist() gives floats
        finite = np.isfinite(wide)
        if finite.all():
            data = wide.tolist()
        else:
            out = wide.astype(object)
            out[np.isnan(wide)] = "NaN"
            out[np.isposinf(wide)] = "Infinity"
            out[np.isneginf(wide)] = "-Infinity"
            data = out.tolist()
    else:
        data = arr.tolist()
    return {"dtype": name, "shape": list(arr.shape), "data": data}


def outputs_to_json(outputs: Mapping[str, Any]) -> bytes:
    body = {"outputs": {name: _json_value(v) for name, v in outputs.items()}}
    return json.dumps(body, allow_nan=False, separators=(",", ":")).encode()


# -- .npz -----------------------------------------------------------------------------------
def _member_header(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> tuple[tuple, np.dtype]:
    fmt = np.lib.format
    with zf.open(info) as f:
        try:
            major, _ = fmt.read_magic(f)
            read = fmt.read_array_header_1_0 if major == 1 else fmt.read_array_header_2_0
            shape, _, dtype = read(f)
        except (ValueError, OSError, zipfile.BadZipFile) as exc:
            raise _bad(f"{info.filename!r} in the .npz body is not a .npy array ({exc})") from None
    return shape, dtype


def feeds_from_npz(body: bytes, limits: Limits) -> dict[str, np.ndarray]:
    """The feeds from an .npz body (``np.savez`` / ``np.savez_compressed`` of named arrays)."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(body))
        infos = zf.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise _bad(f"the request body is not an .npz file ({exc})") from None
    names: list[str] = []
    total = 0
    for info in infos:
        if not info.filename.endswith(".npy"):
            raise _bad(f"{info.filename!r} in the .npz body is not a .npy array")
        name = info.filename[:-4]
        if name in names:
            raise _bad(f"the .npz body holds {name!r} twice")
        names.append(name)
        total += info.file_size
        if total > limits.max_body_bytes:
            raise over_limit(
                TOO_LARGE,
                "the unpacked size of the .npz body's arrays",
                total,
                limits,
                "max_body_bytes",
            )
        shape, dtype = _member_header(zf, info)
        if dtype.kind not in "biufU" or dtype.fields is not None or dtype.subdtype is not None:
            raise _bad(
                f"input {name!r} in the .npz body has dtype {dtype}; give booleans, integers, "
                "floats or strings"
            )
        if math.prod(shape) * dtype.itemsize > info.file_size:
            raise _bad(f"input {name!r} in the .npz body holds less data than its shape {shape}")
    try:
        with np.load(io.BytesIO(body), allow_pickle=False) as npz:
            return {name: npz[name] for name in names}
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise _bad(f"the .npz body could not be read ({exc})") from None


def outputs_to_npz(outputs: Mapping[str, Any]) -> bytes:
    arrays: dict[str, np.ndarray] = {}
    for name, value in outputs.items():
        if not isinstance(value, np.ndarray):
            what = "a map" if isinstance(value, Mapping) else "a sequence"
            raise RequestError(
                NOT_ACCEPTABLE,
                f"output {name!r} is {what}, which an .npz file cannot hold; ask for JSON "
                "(Accept: application/json)",
            )
        if value.dtype == object:
            value = value.astype(str)
        arrays[name] = value
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def is_npz(content_type: str | None, body: bytes) -> bool:
    """Whether a body is an .npz: by its Content-Type, else by the zip signature."""
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind in NPZ_TYPES:
        return True
    if kind == "application/json":
        return False
    return body[:4] == b"PK\x03\x04"
