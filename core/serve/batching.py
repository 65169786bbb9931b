"""Dynamic batching: the requests of one batch run as one, concatenated along the model's
batch axis, when the model has one; one by one otherwise.

A model has a batch axis when every input and every output is a tensor whose
dim 0 is the same symbolic dimension (``batch``, ``batch_size``, ``N``): the
exporters' way of saying rows are independent. ``batch_axis=`` overrides it
(another axis, or None for one by one); a model whose rows interact (a
normalisation over the batch) must be served with None. Requests join one run
only when they feed the same inputs with the same dtypes and the same dims
off the batch axis, and ask for the same outputs; others run in their own
group or alone. When a joined run fails, each of its requests runs alone, so
one bad request gets the session's own error and the others their results.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

AUTO = "auto"


@dataclass(frozen=True)
class BatchAxis:
    """The axis requests are concatenated along (None: one by one), and why."""

    axis: int | None
    reason: str


def _dim(shape: Sequence[Any] | None, axis: int) -> Any:
    if shape is None or len(shape) <= axis:
        return ...
    return shape[axis]


def find_batch_axis(session: Any, requested: int | str | None = AUTO) -> BatchAxis:
    """The batch axis of ``session``'s model: ``requested`` ("auto", an axis, or None)."""
    if requested is None:
        return BatchAxis(None, "run one by one: batch_axis=None was given")
    axis = 0 if requested == AUTO else int(requested)
    args = [("input", a) for a in session.get_inputs()]
    args += [("output", a) for a in session.get_outputs()]
    names: set[str] = set()
    for role, a in args:
        if not a.type.startswith("tensor("):
            return BatchAxis(None, f"run one by one: {role} {a.name!r} is {a.type}, not a tensor")
        d = _dim(a.shape, axis)
        if d is ...:
            return BatchAxis(
                None, f"run one by one: {role} {a.name!r} (shape {a.shape}) has no dim {axis}"
            )
        if isinstance(d, int):
            return BatchAxis(
                None, f"run one by one: {role} {a.name!r} fixes dim {axis} to {d} ({a.shape})"
            )
        if isinstance(d, str):
            names.add(d)
        elif requested == AUTO:
            return BatchAxis(
                None,
                f"run one by one: {role} {a.name!r} has an unnamed dim {axis}, so it is not "
                "known to be the batch (give batch_axis=0 if it is)",
            )
    if requested == AUTO and len(names) != 1:
        return BatchAxis(
            None,
            f"run one by one: dim 0 is not one dimension shared by every input and output "
            f"({', '.join(sorted(names))}); give batch_axis=0 if rows are independent",
        )
    label = f" ({next(iter(names))!r} of every input and output)" if len(names) == 1 else ""
    return BatchAxis(axis, f"concatenated along axis {axis}{label}")


@dataclass
class Request:
    """One /infer request: the feeds and the outputs asked for (None: all)."""

    feeds: dict[str, Any]
    outputs: list[str] | None = None


def rows(req: Request, axis: int) -> int | None:
    """The request's rows along ``axis``: the dim every feed has there, or None when the
    feeds are not arrays or disagree (such a request runs alone)."""
    sizes = set()
    for v in req.feeds.values():
        if not isinstance(v, np.ndarray) or v.ndim <= axis:
            return None
        sizes.add(v.shape[axis])
    return sizes.pop() if len(sizes) == 1 else None


def _signature(req: Request, axis: int) -> tuple | None:
    if rows(req, axis) is None:
        return None
    feeds = tuple(
        (name, v.dtype.str, v.shape[:axis] + v.shape[axis + 1 :])
        for name, v in sorted(req.feeds.items())
    )
    return feeds, tuple(req.outputs) if req.outputs else None


class BatchRunner:
    """Runs a batch of requests on one session, as ``BatchAxis`` says."""

    def __init__(self, session: Any, axis: BatchAxis) -> None:
        self.session = session
        self.axis = axis
        #: runs made, requests they served, and the most requests one run served
        self.runs = 0
        self.requests = 0
        self.largest = 0
        self._lock = threading.Lock()  # requests run from several threads at once

    def _count(self, requests: int) -> None:
        with self._lock:
            self.runs += 1
            self.requests += requests
            self.largest = max(self.largest, requests)

    def run_one(self, req: Request) -> list[Any] | BaseException:
        """One request alone: its outputs, or the exception the session raised."""
        self._count(1)
        try:
            return self.session.run(req.outputs, req.feeds)
        except Exception as exc:  # noqa: BLE001 - the request's answer, not the server's
            return exc

    def run(self, batch: Sequence[Request]) -> list[list[Any] | BaseException]:
        """Each request's outputs (or exception), in order."""
        out: list[Any] = [None] * len(batch)
        axis = self.axis.axis
        groups: dict[tuple, list[int]] = {}
        for i, req in enumerate(batch):
            key = None if axis is None else _signature(req, axis)
            if key is None:
                out[i] = self.run_one(req)
            else:
                groups.setdefault(key, []).append(i)
        for members in groups.values():
            if len(members) == 1:
                out[members[0]] = self.run_one(batch[members[0]])
                continue
            joined = self._run_joined([batch[i] for i in members], axis)
            for i, result in zip(members, joined):
                out[i] = result
        return out

    def _run_joined(self, reqs: list[Request], axis: int) -> list[Any]:
        counts = [rows(r, axis) for r in reqs]
        total = sum(counts)
        feeds = {
            name: np.concatenate([r.feeds[name] for r in reqs], axis=axis) for name in reqs[0].feeds
        }
        try:
            outs = self.session.run(reqs[0].outputs, feeds)
        except Exception:  # noqa: BLE001 - each request then gets its own answer
            return [self.run_one(r) for r in reqs]
        if not all(isinstance(o, np.ndarray) and _dim(o.shape, axis) == total for o in outs):
            # the model broke the batch axis's promise: rows are not rows; serve each alone
            return [self.run_one(r) for r in reqs]
        self._count(len(reqs))
        cuts = np.cumsum(counts)[:-1]
        parts = [np.split(o, cuts, axis=axis) for o in outs]
        return [[p[k] for p in parts] for k in range(len(reqs))]
