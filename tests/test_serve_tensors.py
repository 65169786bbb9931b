"""onnxep.serve.tensors: named tensors from and to JSON and .npz bodies, nothing unpickled.

Every dtype goes through JSON and back to the same bits (non-finite floats as
protobuf's JSON strings); a bad body is a 400 that names what is wrong; an
.npz is read with allow_pickle=False after its headers are checked, so an
object array, a lying header or a member that unpacks past the limit is
refused before any array is made.
"""

from __future__ import annotations

import io
import json
import zipfile

import ml_dtypes
import numpy as np
import pytest

from onnxep.serve.limits import Limits, RequestError
from onnxep.serve.tensors import (
    DTYPES,
    feeds_from_json,
    feeds_from_npz,
    is_npz,
    outputs_to_json,
    outputs_to_npz,
    tensor_from_json,
)


def _roundtrip(arr: np.ndarray) -> np.ndarray:
    body = outputs_to_json({"x": arr})
    doc = json.loads(body)  # strict JSON: Python's parser would take NaN, others do not
    assert "NaN" not in body.decode().replace('"NaN"', "")
    return tensor_from_json("x", doc["outputs"]["x"])


@pytest.mark.parametrize("name", [n for n in DTYPES if n != "string"])
def test_every_dtype_reads_back_to_the_same_bits(name):
    rng = np.random.default_rng(1)
    dtype = DTYPES[name]
    if dtype.kind == "b":
        arr = rng.integers(0, 2, (2, 3)).astype(bool)
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        arr = np.array([[info.min, 0, info.max], [1, 2, 3]], dtype)
    else:
        arr = rng.standard_normal((2, 3)).astype(dtype)
        arr[0, 0], arr[0, 1], arr[0, 2] = np.nan, np.inf, -np.inf
    back = _roundtrip(arr)
    assert back.dtype == dtype and back.shape == arr.shape
    assert back.tobytes() == arr.tobytes()


def test_strings_scalars_and_empty_tensors():
    strings = np.array([["a", "bé"], ["", "z"]], dtype=object)
    back = _roundtrip(strings)
    assert back.dtype == object and back.tolist() == strings.tolist()
    assert _roundtrip(np.array(2.5, np.float32)).shape == ()
    empty = _roundtrip(np.zeros((0, 4), np.int64))
    assert empty.shape == (0, 4) and empty.dtype == np.int64


def test_flat_data_takes_the_shape_and_nested_data_must_match_it():
    x = tensor_from_json("x", {"dtype": "float32", "shape": [2, 2], "data": [1, 2, 3, 4]})
    assert x.tolist() == [[1, 2], [3, 4]] and x.dtype == np.float32
    x = tensor_from_json("x", {"dtype": "int64", "data": [[1, 2], [3, 4]]})
    assert x.shape == (2, 2)
    with pytest.raises(RequestError, match=r"data has shape \[2, 2\].*shape says \[4, 1\]"):
        tensor_from_json("x", {"dtype": "int64", "shape": [4, 1], "data": [[1, 2], [3, 4]]})


@pytest.mark.parametrize(
    "obj, message",
    [
        ({"dtype": "float32", "data": [1, "2"]}, r"'2' is not a number"),
        ({"dtype": "int8", "data": [1, 300]}, r"300 does not fit int8 \(-128 to 127\)"),
        ({"dtype": "int64", "data": [1.5]}, r"values must be whole numbers"),
        ({"dtype": "bool", "data": [1, 0]}, r"values must be true or false"),
        ({"dtype": "float16", "data": [1e6]}, r"1000000.0 is too large for float16"),
        ({"dtype": "string", "data": ["a", 1]}, r"every value must be a JSON string"),
        ({"dtype": "complex64", "data": [1]}, r"dtype 'complex64' is not one of bool"),
        ({"dtype": "float32", "data": [[1, 2], [3]]}, r"nested lists must all have the same"),
        ({"dtype": "float32", "shape": [-1], "data": [1]}, r"shape must be a list of whole"),
        ({"dtype": "float32", "data": [1], "extra": 2}, r"unknown field\(s\) 'extra'"),
        ([1, 2], r"must be an object"),
    ],
)
def test_a_bad_tensor_is_a_400_naming_it(obj, message):
    with pytest.raises(RequestError, match=message) as info:
        tensor_from_json("x", obj)
    assert info.value.status == 400 and "'x'" in info.value.message


@pytest.mark.parametrize(
    "body, message",
    [
        (b"{not json", r"not valid JSON"),
        (b"[1, 2]", r'must be an object \{"inputs"'),
        (b'{"inputs": {}, "oops": 1}', r"unknown field\(s\) 'oops'"),
        (b'{"inputs": {}, "outputs": "y"}', r'"outputs" must be a list'),
        (b"[" * 100_000 + b"]" * 100_000, r"nested too deeply|not valid JSON"),
        (b"\xff\xfe", r"not valid JSON"),
    ],
)
def test_a_malformed_body_is_a_400(body, message):
    with pytest.raises(RequestError, match=message) as info:
        feeds_from_json(body)
    assert info.value.status == 400


def _npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


def test_npz_bodies_read_back_and_outputs_write_npz():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    s = np.array(["a", "bc"])
    feeds = feeds_from_npz(_npz(x=x, s=s), Limits())
    assert feeds["x"].tobytes() == x.tobytes() and feeds["s"].tolist() == ["a", "bc"]
    out = np.load(io.BytesIO(outputs_to_npz({"y": x, "t": np.array(["q"], dtype=object)})))
    assert out["y"].tobytes() == x.tobytes() and out["t"].tolist() == ["q"]
    with pytest.raises(RequestError, match=r"output 'm' is a sequence.*ask for JSON") as info:
        outputs_to_npz({"m": [{1: 0.5}]})
    assert info.value.status == 406


def test_npz_refuses_pickles_lies_and_bombs():
    # an object array can only be stored pickled: refused from its header, never loaded
    buf = io.BytesIO()
    np.savez(buf, o=np.array([{"a": 1}], dtype=object))
    with pytest.raises(RequestError, match=r"'o' in the .npz body has dtype object"):
        feeds_from_npz(buf.getvalue(), Limits())
    # a header that claims more data than the member holds
    lie = io.BytesIO()
    with zipfile.ZipFile(lie, "w") as zf:
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            header, {"descr": "<f4", "fortran_order": False, "shape": (10**9,)}
        )
        zf.writestr("x.npy", np.lib.format.MAGIC_PREFIX + b"\x01\x00" + header.getvalue()[8:])
    with pytest.raises(RequestError, match=r"holds less data than its shape|not a .npy"):
        feeds_from_npz(lie.getvalue(), Limits())
    # 64 MB of zeros compresses to a few kB: refused by its unpacked size
    bomb = _npz(z=np.zeros(16 * 1024 * 1024, np.float32))
    assert len(bomb) < 1_000_000
    with pytest.raises(
        RequestError, match=r"unpacked size .* is 67,108,9\d\d, over .*\(max_body_bytes"
    ) as e:
        feeds_from_npz(bomb, Limits(max_body_bytes=64 * 1024 * 1024))
    assert e.value.status == 413
    with pytest.raises(RequestError, match=r"not an .npz file"):
        feeds_from_npz(b"PK\x03\x04garbage", Limits())


def test_content_type_or_the_zip_signature_says_npz():
    assert is_npz("application/x-npz", b"{}")
    assert is_npz(None, _npz(x=np.zeros(1)))
    assert not is_npz("application/json; charset=utf-8", b"PK\x03\x04")
    assert not is_npz(None, b'{"inputs": {}}')


def test_bfloat16_and_maps_to_json():
    arr = np.array([1.5, -2.0], ml_dtypes.bfloat16)
    assert _roundtrip(arr).dtype == DTYPES["bfloat16"]
    doc = json.loads(outputs_to_json({"m": [{1: np.float32(0.25), 2: np.float32(np.nan)}]}))
    assert doc["outputs"]["m"] == {
        "dtype": "sequence",
        "data": [{"dtype": "map", "data": {"1": 0.25, "2": "NaN"}}],
    }
