"""HTTP helpers for the onnxep.serve tests: every call has a timeout, every address is loopback."""

from __future__ import annotations

import io
import json
import socket
import urllib.error
import urllib.request
from typing import Any

import numpy as np

TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(url: str, body: bytes | None = None, headers: dict[str, str] | None = None, method=None):
    """(status, body bytes, content type) of one request; HTTP errors are answers too."""
    assert url.startswith("http://127.0.0.1:"), url
    req = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
            return r.status, r.read(), r.headers.get("content-type")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("content-type")


def post_json(url: str, doc: Any) -> tuple[int, Any]:
    status, body, _ = call(url, json.dumps(doc).encode(), {"Content-Type": "application/json"})
    return status, json.loads(body) if body.startswith((b"{", b"[")) else body


def json_tensor(arr: np.ndarray) -> dict[str, Any]:
    return {"dtype": arr.dtype.name, "shape": list(arr.shape), "data": arr.tolist()}


def infer_json(url: str, feeds: dict[str, np.ndarray]) -> tuple[int, Any]:
    status, doc = post_json(url, {"inputs": {k: json_tensor(v) for k, v in feeds.items()}})
    if status != 200:
        return status, doc
    return status, {
        k: np.asarray(v["data"], dtype=v["dtype"]).reshape(v["shape"])
        for k, v in doc["outputs"].items()
    }


def infer_npz(url: str, feeds: dict[str, np.ndarray]) -> tuple[int, Any]:
    buf = io.BytesIO()
    np.savez(buf, **feeds)
    status, body, kind = call(url, buf.getvalue(), {"Content-Type": "application/x-npz"})
    if status != 200:
        return status, json.loads(body)
    assert kind == "application/x-npz"
    with np.load(io.BytesIO(body), allow_pickle=False) as npz:
        return status, {k: npz[k] for k in npz.files}


def sse_events(body: bytes) -> list[Any]:
    """The data of each server-sent event; the last must be [DONE]."""
    events = [ln[6:] for ln in body.decode().split("\n\n") if ln.startswith("data: ")]
    assert events and events[-1] == "[DONE]", body[-200:]
    return [json.loads(e) for e in events[:-1]]


def stream(url: str, doc: Any) -> tuple[int, list[Any]]:
    status, body, kind = call(url, json.dumps(doc).encode(), {"Content-Type": "application/json"})
    if status != 200:
        return status, json.loads(body)
    assert kind.startswith("text/event-stream"), kind
    return status, sse_events(body)
