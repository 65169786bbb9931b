"""What a kernel says when a run-time value is past the table or buffer it indexes.

Attention kernels index tables with values that arrive at run time: a
rotary position picks a row of the cos/sin cache, ``seqlens_k`` says how
many rows of the KV cache a batch row holds. A value past the table is the
model's or the caller's mistake (a context longer than the export's
``max_position_embeddings``, a cache of too small a capacity), and the user
must read which value, which limit, and what to change -- the same sentence
whichever provider found it. So the sentences are written once, here: the
CPU kernels raise :class:`OutOfBounds` with them (the executor raises
:class:`~onnxep.errors.BoundsError` with the node's name in front), and the
CUDA provider decodes its device error record into the very same text.

The ``check_*`` functions are the host-side checks of the kernels that run
on an array namespace: on NumPy arrays they cost a ``min``/``max``; on a
device namespace one reduction read back, refused while a CUDA graph is
being captured (the step then runs eagerly), as ``ops/_indices.py`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "OutOfBounds",
    "check_kv_lengths",
    "check_positions",
    "check_query_lengths",
    "check_sequence_lengths",
    "first_id_where",
    "host_answer",
    "position_ids_where",
    "kv_length_text",
    "position_text",
    "query_length_text",
    "sequence_length_text",
    "token_where",
]


class OutOfBounds(IndexError):
    """Raised by a kernel with one of this module's sentences; the executor turns it into
    :class:`onnxep.errors.BoundsError` naming the node."""


def position_text(position: int, rows: int, where: str, cache: str = "cos_cache") -> str:
    """A rotary position outside the cos/sin cache's ``rows`` rows."""
    if position < 0:
        return (
            f"position {position} ({where}) is negative: rotary positions index {cache} from "
            "row 0; give position ids of 0 or more"
        )
    return (
        f"position {position} ({where}) is past the rotary cache's {rows} rows ({cache}); "
        f"export the model with a larger max_position_embeddings or keep the context within "
        f"{rows} tokens"
    )


def kv_length_text(batch: int, value: int, limit: int, capacity: int) -> str:
    """``seqlens_k[batch]`` outside ``-1 .. limit - 1``: a step attends ``seqlens_k + 1``
    tokens, which must fit the present cache's ``capacity`` rows and, when it is shorter,
    attention_bias's ``limit`` key columns."""
    if value < -1:
        return (
            f"seqlens_k[{batch}] = {value} is below -1: it holds each batch row's token count "
            "minus one"
        )
    if limit < capacity:
        return (
            f"seqlens_k[{batch}] = {value} asks for {value + 1} tokens, past the {limit} key "
            f"columns of attention_bias; give attention_bias a column per key of the "
            f"{value + 1} or keep the context within {limit} tokens"
        )
    return (
        f"seqlens_k[{batch}] = {value} asks for {value + 1} tokens, past the KV cache's "
        f"{capacity} rows (present_key); use a KV cache of a larger capacity (a longer "
        f"past_key buffer, or a larger total_sequence_length) or keep the context within "
        f"{capacity} tokens"
    )


def query_length_text(batch: int, value: int, limit: int, new_tokens: int) -> str:
    """``query_seqlens[batch]`` outside ``0 .. limit``: at most the step's ``new_tokens`` and
    the batch row's token count."""
    return (
        f"query_seqlens[{batch}] = {value} is outside 0..{limit}: a batch row's new tokens "
        f"number at most the step's {new_tokens} and its seqlens_k + 1"
    )


def sequence_length_text(batch: int, value: int, steps: int) -> str:
    """``sequence_lens[batch]`` outside ``0 .. steps``: a batch row runs at most X's steps."""
    return (
        f"sequence_lens values must be in [0, {steps}] (the sequence length of X), got "
        f"sequence_lens[{batch}] = {value}; give each batch row's number of valid steps"
    )


def token_where(index: tuple[int, ...]) -> str:
    """Where a position derived from ``seqlens_k`` comes from: ``index`` is (batch, token)."""
    b, s = index
    return f"token {s} of batch row {b}"


def position_ids_where(index: tuple[int, ...]) -> str:
    """Where a position given as ``position_ids[index]`` comes from."""
    return f"position_ids[{', '.join(str(i) for i in index)}]"


def first_id_where(index: tuple[int, ...]) -> str:
    """Where a position counted on from the first id comes from: ``index`` is (batch, token)."""
    return f"position_ids[0] + {index[1]}"


def check_positions(
    xp: Any,
    positions: Any,
    rows: int,
    where: Callable[[tuple[int, ...]], str],
    valid: Any = None,
    cache: str = "cos_cache",
) -> None:
    """Raise OutOfBounds for the first (row-major) entry of ``positions`` outside
    ``[0, rows)`` where ``valid`` (a boolean array of the same shape) holds; ``where(index)``
    says where that entry came from."""
    if _size(positions) == 0:
        return
    bad = (positions < 0) | (positions >= rows)
    if valid is not None:
        bad = bad & valid
    if not _any(xp, bad):
        return
    host_pos, host_bad = _host(xp, positions), _host(xp, bad)
    first = tuple(int(i) for i in np.argwhere(host_bad)[0])
    raise OutOfBounds(position_text(int(host_pos[first]), rows, where(first), cache))


def check_kv_lengths(xp: Any, seqlens_k: Any, limit: int, capacity: int) -> None:
    """``seqlens_k`` (one entry per batch row) within ``-1 .. limit - 1``."""
    lens = xp.reshape(seqlens_k, (-1,))
    if _size(lens) == 0:
        return
    bad = (lens < -1) | (lens >= limit)
    if not _any(xp, bad):
        return
    host, b = _host(xp, lens), int(np.argmax(_host(xp, bad)))
    raise OutOfBounds(kv_length_text(b, int(host[b]), limit, capacity))


def check_query_lengths(xp: Any, query_seqlens: Any, tokens: Any, new_tokens: int) -> None:
    """``query_seqlens[b]`` within ``0 .. min(new_tokens, tokens[b])`` (``tokens`` = T)."""
    q = xp.reshape(query_seqlens, (-1,))
    t = xp.reshape(tokens, (-1,))
    limit = xp.minimum(t, new_tokens)
    bad = (q < 0) | (q > limit)
    if _size(q) == 0 or not _any(xp, bad):
        return
    b = int(np.argmax(_host(xp, bad)))
    hq, hl = _host(xp, q), _host(xp, limit)
    raise OutOfBounds(query_length_text(b, int(hq[b]), int(hl[b]), new_tokens))


def check_sequence_lengths(xp: Any, lens: Any, steps: int) -> None:
    """``sequence_lens`` of a recurrence (one entry per batch row) within ``0 .. steps``."""
    if _size(lens) == 0:
        return
    bad = (lens < 0) | (lens > steps)
    if not _any(xp, bad):
        return
    host, b = _host(xp, lens), int(np.argmax(_host(xp, bad)))
    raise OutOfBounds(sequence_length_text(b, int(host[b]), steps))


def _size(a: Any) -> int:
    n = 1
    for s in a.shape:
        n *= int(s)
    return n


def _any(xp: Any, bad: Any) -> bool:
    if type(bad) is np.ndarray:
        return bool(bad.any())
    return host_answer(xp, xp.any(bad), "its bounds check")


def host_answer(xp: Any, flag: Any, op: str) -> bool:
    """``flag`` (a device boolean) read on the host; refused while a CUDA graph is captured,
    so the capture fails and the step runs eagerly, checked, between graphs."""
    if capturing(xp):
        raise RuntimeError(
            f"{op} reads the device, which a CUDA graph capture cannot hold; the step runs "
            "eagerly instead"
        )
    return bool(flag)


def capturing(xp: Any) -> bool:
    """Whether the namespace's current stream is recording a CUDA graph (CuPy)."""
    cuda = getattr(xp, "cuda", None)
    current = getattr(cuda, "get_current_stream", None)
    if current is None:
        return False
    is_capturing = getattr(current(), "is_capturing", None)
    return bool(is_capturing()) if is_capturing is not None else False


def _host(xp: Any, a: Any) -> np.ndarray:
    asnumpy = getattr(xp, "asnumpy", None)
    return asnumpy(a) if asnumpy is not None else np.asarray(a)
