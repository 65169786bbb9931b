"""Buffers a caller gave up for one run, which a kernel may write its output over.

A kernel registered with ``inplace=((i, o), ...)`` may write output ``o`` over
input ``i`` and return that very array, but only where the caller allowed it
for this run: IO binding bound one buffer as the graph input that is the
node's input ``i`` and as the graph output that is its output ``o``, and no
other node reads that input (the session works out which pairs qualify once,
from the plan; see ``InferenceSession``'s ``inplace_pairs``). Everywhere else
the kernel writes a fresh buffer, so a caller's array is never changed behind
its back. The session sets the donations around the run; a kernel asks
:func:`may_overwrite` with its node's name and the input it was given, which
checks the very address, so a copy made on the way (a transfer) is never
written by mistake.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any

import numpy as np

_DONATED: ContextVar[Mapping[str, int] | None] = ContextVar("onnxep_donated", default=None)


def array_address(x: Any) -> int | None:
    """Where an array's data starts (NumPy, or a device array with ``data.ptr`` as CuPy's);
    None when it holds no elements or says nothing of where it is."""
    if not getattr(x, "size", 0):
        return None
    if isinstance(x, np.ndarray):
        return x.ctypes.data
    ptr = getattr(getattr(x, "data", None), "ptr", None)
    return None if ptr is None else int(ptr)


def may_overwrite(node_name: str, array: Any) -> bool:
    """True when this run's caller gave up ``array``'s buffer to node ``node_name``."""
    donated = _DONATED.get()
    if not donated:
        return False
    given = donated.get(node_name)
    if given is None or given.__class__ is int:
        return given is not None and given == array_address(array)
    return array_address(array) in given


def any_donated() -> bool:
    """Whether some buffer is given up here (a run within must set its own donations)."""
    return bool(_DONATED.get())


@contextlib.contextmanager
def donating(by_node: Mapping[str, int | tuple[int, ...]]) -> Iterator[None]:
    """Within the block, node ``name`` may overwrite the buffer at ``by_node[name]``, or
    each buffer of a tuple of addresses (a node with several in-place pairs, as
    GroupQueryAttention's key and value caches)."""
    token = _DONATED.set(dict(by_node))
    try:
        yield
    finally:
        _DONATED.reset(token)


@contextlib.contextmanager
def not_donating() -> Iterator[None]:
    """Within the block no buffer is given up (a step that may run twice must not update a
    state in place: see ``CapturedRunner``)."""
    with donating({}):
        yield
