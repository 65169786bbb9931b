"""A device-side error flag: kernels report a value past its table without a host read.

An index op must refuse an index outside ``[-d, d-1]``, and an attention
kernel a rotary position past its cos/sin cache or a token count past its
KV cache (design: bad input gets a clear error). Deciding that on the host
costs a device-to-host read per op, which a decode step cannot afford and a
CUDA graph cannot contain. So the CUDA kernels check every such value where
they read it, read nothing past a table for a bad one (an index kernel
writes zeros, a rotary channel becomes NaN), and record the first bad one in
a small int32 buffer owned by the provider (:data:`RECORD_WORDS` words,
layout below). The provider looks at the record where it synchronizes anyway
-- :meth:`ErrorFlag.before_sync` queues a copy of the record into a pinned
host mirror on the provider's stream, the caller's own synchronization
delivers it, and :meth:`ErrorFlag.after_sync` raises
:class:`~onnxep.errors.RunError` naming the node, the value and the limit,
after clearing the record so the session stays usable. A graph replay
writes the record as the eager kernel does, so a captured run raises at the
same read. A session without such kernels never copies the record.

Record layout (int32 words, little-endian; 64-bit fields are word pairs,
low word first), written by ``ix_report`` in ``ops/index_cuda.py`` (kind 0)
and by :data:`RECORD_SOURCE`'s ``onnxep_fault`` (the attention kernels):

====  ========================================================================
0     state: 0 clear, 1 set (the kernel thread that sets it writes the rest)
1     node id: the entry of this flag's node table (:meth:`ErrorFlag.register`)
2     kind 0: the axis the bad index addresses (of the node's data input);
      kind 1: where the position came from (:data:`FROM_TOKEN` ...)
3     kind: :data:`INDEX`, :data:`POSITION`, :data:`KV_LENGTH`, :data:`QUERY_LENGTH`,
      :data:`SEQUENCE_LENGTH`
4-5   the value as the model gave it (index, position, seqlens_k, query_seqlens,
      sequence_lens)
6-7   where it sits: its flat (row-major) position in the input, or the batch row
8-9   the limit: the axis length, the cos/sin cache's rows, the tokens allowed,
      the sequence length of X
10-11 the number of entries of the input it sits in
12-13 kind 1: the step's new tokens per row; kind 2: the KV cache's capacity;
      kind 3: the step's new tokens
====  ========================================================================

Kernels are built while a provider's flag is made current on the building
thread (:func:`building`, entered by ``CUDAProvider.claim``); a builder that
finds none (a kernel built outside a session) uses the generic kernel.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxep.errors import BoundsError, RunError
from onnxep.providers import bounds

__all__ = [
    "FROM_FIRST_ID",
    "FROM_IDS",
    "FROM_TOKEN",
    "INDEX",
    "KV_LENGTH",
    "POSITION",
    "QUERY_LENGTH",
    "RECORD_SOURCE",
    "RECORD_WORDS",
    "SEQUENCE_LENGTH",
    "ErrorFlag",
    "Fault",
    "building",
    "current",
    "decode",
    "encode",
    "fault_message",
]

RECORD_WORDS = 16
_STATE, _NODE, _AXIS, _KIND = 0, 1, 2, 3
#: int64 slots (word pairs) of the record: value, position, limit, count, extra.
_VALUE, _POSITION, _DIM, _COUNT, _EXTRA = 2, 3, 4, 5, 6
#: cudaMemcpyKind device-to-host.
_D2H = 2

#: Fault kinds: an index out of range (index kernels), a rotary position outside the cos/sin
#: cache, a seqlens_k past the KV cache, a query_seqlens past the step's tokens, a
#: sequence_lens value outside [0, seq_length] (the recurrence kernels).
INDEX, POSITION, KV_LENGTH, QUERY_LENGTH, SEQUENCE_LENGTH = 0, 1, 2, 3, 4
#: Where a position came from (word 2 of a POSITION fault): a batch row's token, counted from
#: seqlens_k (position = b * S + s); position_ids itself (flat position); position_ids[0] + s.
FROM_TOKEN, FROM_IDS, FROM_FIRST_ID = 0, 1, 2

#: The CUDA C that writes the record: ``onnxep_fault(flag, node, kind, axis, value, position,
#: limit, count, extra)`` records unless a fault is recorded already (or ``flag`` is null: a
#: kernel built outside a session, which nobody would read).
RECORD_SOURCE = f"""
#define ONNXEP_FAULT_POSITION {POSITION}
#define ONNXEP_FAULT_KV_LENGTH {KV_LENGTH}
#define ONNXEP_FAULT_QUERY_LENGTH {QUERY_LENGTH}
#define ONNXEP_FROM_TOKEN {FROM_TOKEN}
#define ONNXEP_FROM_IDS {FROM_IDS}
#define ONNXEP_FROM_FIRST_ID {FROM_FIRST_ID}
__device__ __forceinline__ void onnxep_put64(int* w, long long v) {{
  const unsigned long long u = (unsigned long long)v;
  w[0] = (int)(unsigned int)(u & 0xffffffffull);
  w[1] = (int)(unsigned int)(u >> 32);
}}
__device__ void onnxep_fault(int* flag, int node, int kind, int axis, long long value,
                             long long position, long long limit, long long count,
                             long long extra) {{
  if (flag == nullptr || atomicCAS(flag + {_STATE}, 0, 1) != 0) return;
  flag[{_NODE}] = node;
  flag[{_AXIS}] = axis;
  flag[{_KIND}] = kind;
  onnxep_put64(flag + {2 * _VALUE}, value);
  onnxep_put64(flag + {2 * _POSITION}, position);
  onnxep_put64(flag + {2 * _DIM}, limit);
  onnxep_put64(flag + {2 * _COUNT}, count);
  onnxep_put64(flag + {2 * _EXTRA}, extra);
}}
"""


@dataclass(frozen=True)
class Fault:
    """One recorded fault (see the module's record layout); ``kind`` 0 is an index."""

    node: int
    axis: int
    value: int
    position: int
    dim: int
    count: int
    kind: int = INDEX
    extra: int = 0


def decode(words: Any) -> Fault | None:
    """The fault a record holds, or None when it is clear."""
    w = np.ascontiguousarray(words, dtype="<i4")
    if w.shape != (RECORD_WORDS,):
        raise ValueError(f"an error record has {RECORD_WORDS} int32 words, got shape {w.shape}")
    if w[_STATE] == 0:
        return None
    wide = w.view("<i8")
    return Fault(
        node=int(w[_NODE]),
        axis=int(w[_AXIS]),
        value=int(wide[_VALUE]),
        position=int(wide[_POSITION]),
        dim=int(wide[_DIM]),
        count=int(wide[_COUNT]),
        kind=int(w[_KIND]),
        extra=int(wide[_EXTRA]),
    )


def encode(fault: Fault) -> np.ndarray:
    """The record a kernel writes for ``fault`` (the inverse of :func:`decode`)."""
    w = np.zeros(RECORD_WORDS, dtype="<i4")
    w[_STATE], w[_NODE], w[_AXIS], w[_KIND] = 1, fault.node, fault.axis, fault.kind
    wide = w.view("<i8")
    wide[_VALUE], wide[_POSITION] = fault.value, fault.position
    wide[_DIM], wide[_COUNT], wide[_EXTRA] = fault.dim, fault.count, fault.extra
    return w


def _where(fault: Fault, shape: tuple[int, ...] | None) -> str:
    """``indices[i, j]`` when the indices' shape is known to match the record, else the flat
    position (a node run with several shapes between two checks)."""
    if shape is not None and math.prod(shape) == fault.count and 0 <= fault.position < fault.count:
        pos = np.unravel_index(fault.position, shape) if shape else ()
        return "indices" + ("[" + ", ".join(str(int(p)) for p in pos) + "]" if pos else "")
    return f"entry {fault.position} of the {fault.count} indices (flattened, row-major)"


def fault_message(fault: Fault, label: str, shape: tuple[int, ...] | None = None) -> str:
    """What the user reads: the node, the index, where it sits, the valid range, what next."""
    d = fault.dim
    valid = f"valid values are {-d} to {d - 1}" if d > 0 else "no value is valid there"
    return (
        f"{label}: indices value {fault.value} at {_where(fault, shape)} is out of range for "
        f"axis {fault.axis} of size {d}: {valid}. The GPU kernel found it without stopping "
        "the stream (the rows it gathered there are zeros), so the error surfaces here, at "
        "the next read of the run's results; the session stays usable: fix the indices and "
        "run again"
    )


def bounds_message(fault: Fault, label: str, shape: tuple[int, ...] | None = None) -> str:
    """The CPU kernels' sentence (``onnxep.providers.bounds``) for a fault of kind 1-4."""
    f = fault
    if f.kind == POSITION:
        text = bounds.position_text(f.value, f.dim, _position_where(f, shape))
    elif f.kind == KV_LENGTH:
        text = bounds.kv_length_text(f.position, f.value, f.dim, f.extra)
    elif f.kind == SEQUENCE_LENGTH:
        text = bounds.sequence_length_text(f.position, f.value, f.dim)
    else:
        text = bounds.query_length_text(f.position, f.value, f.dim, f.extra)
    return f"{label}: {text}"


def _position_where(fault: Fault, shape: tuple[int, ...] | None) -> str:
    if fault.axis == FROM_TOKEN:
        return bounds.token_where(divmod(fault.position, max(1, fault.extra)))
    if fault.axis == FROM_FIRST_ID:
        return bounds.first_id_where((0, fault.position))
    if shape is not None and math.prod(shape) == fault.count and 0 <= fault.position < fault.count:
        return bounds.position_ids_where(
            tuple(int(i) for i in np.unravel_index(fault.position, shape))
        )
    return f"entry {fault.position} of the {fault.count} position_ids (flattened, row-major)"


class ErrorFlag:
    """One provider's error record, its host mirror and its table of index nodes.

    ``words`` is what kernels write (a device array; a NumPy array when the
    kernels are emulated on the host, where ``mirror`` is ``words`` itself).
    ``read`` queues the copy of ``words`` into ``mirror``; ``clear`` queues
    zeroing ``words``. Both run on the provider's stream, so they are ordered
    after every kernel queued before them.
    """

    def __init__(
        self,
        words: Any,
        mirror: np.ndarray,
        read: Callable[[], None],
        clear: Callable[[], None],
    ) -> None:
        self.words = words
        self.mirror = mirror
        self._read = read
        self._clear = clear
        self._lock = threading.Lock()
        #: ``Gather node 'name'`` for each registered node id.
        self.labels: list[str] = []
        #: The indices' (or position ids') shape of each node's latest call (kernels' runners
        #: keep it current).
        self.shapes: list[tuple[int, ...] | None] = []
        #: Whether any kernel that writes the record was built: until then syncs skip the read.
        self.used = False
        #: Copies of the record queued so far (each rides on a synchronization the caller
        #: makes anyway, so none is a device-to-host read of its own) and errors raised.
        self.reads = 0
        self.raised = 0

    @classmethod
    def on_device(cls, cupy: Any, stream: Any) -> ErrorFlag:
        """A record in device memory (from the current allocator), cleared on ``stream``."""
        import cupyx

        nbytes = RECORD_WORDS * 4
        words = cupy.empty(RECORD_WORDS, dtype=np.int32)
        mirror = cupyx.empty_pinned((RECORD_WORDS,), dtype=np.int32)
        mirror[:] = 0
        rt = cupy.cuda.runtime
        dptr, hptr = words.data.ptr, mirror.ctypes.data

        def read() -> None:
            rt.memcpyAsync(hptr, dptr, nbytes, _D2H, stream.ptr)

        def clear() -> None:
            rt.memsetAsync(dptr, 0, nbytes, stream.ptr)

        clear()
        return cls(words, mirror, read, clear)

    @classmethod
    def on_host(cls) -> ErrorFlag:
        """A record in host memory, for kernels emulated on the CPU (and for tests)."""
        words = np.zeros(RECORD_WORDS, dtype=np.int32)
        return cls(words, words, lambda: None, lambda: words.fill(0))

    def register(self, op_type: str, node_name: str) -> int:
        """A node id for a kernel about to be built; the record names the node by it."""
        with self._lock:
            self.labels.append(f"{op_type} node {node_name!r}")
            self.shapes.append(None)
            self.used = True
            return len(self.labels) - 1

    def before_sync(self) -> None:
        """Queue the record's copy into the mirror; call just before synchronizing the stream."""
        if self.used:
            self._read()
            self.reads += 1

    def after_sync(self) -> None:
        """Raise :class:`RunError` if the mirror (read by :meth:`before_sync` and delivered by
        the synchronization since) holds a fault; the record is cleared first."""
        if not self.used or not self.mirror[_STATE]:
            return
        fault = decode(self.mirror)
        self.mirror[:] = 0
        self._clear()
        self.raised += 1
        assert fault is not None
        if fault.kind == INDEX:
            raise RunError(self.describe(fault))
        raise BoundsError(self.describe(fault))

    def describe(self, fault: Fault) -> str:
        if 0 <= fault.node < len(self.labels):
            label, shape = self.labels[fault.node], self.shapes[fault.node]
        else:
            label, shape = f"a node (id {fault.node}, not one of this session's)", None
        if fault.kind == INDEX:
            return fault_message(fault, label, shape)
        return bounds_message(fault, label, shape)


_building = threading.local()


@contextlib.contextmanager
def building(flag: ErrorFlag | None) -> Iterator[None]:
    """Make ``flag`` the one kernels built on this thread report to."""
    previous = getattr(_building, "flag", None)
    _building.flag = flag
    try:
        yield
    finally:
        _building.flag = previous


def current() -> ErrorFlag | None:
    """The flag made current by :func:`building` on this thread, or None."""
    return getattr(_building, "flag", None)
