"""A host decode step's attention mask and position ids, as views of buffers made once.

A decode step feeds one token per row after ``past`` fed ones. Row ``b`` (padded on the
right by ``pad[b]`` tokens, see ``greedy._right_padding``) then holds ``past + 1 - pad[b]``
real tokens: its mask has ones there and zeros after, as wide as the growing cache
(``past + 1``) or the shared buffers' capacity, and its position id is ``past - pad[b]``.
Made fresh each step these were six NumPy calls, 12 us of a tiny decoder's 250 us step on
the host. Here the mask is one buffer whose newly real column is set each step and handed
out as a view of its first columns, and the positions are rows of a table of the next
``CHUNK`` steps, made when the last one is used up.

A mask view is valid until the next step's :meth:`StepInputs.mask`, which may set a column
it shows (the full-capacity mask's next one, or a padded row's): a run reads it and keeps
nothing, and whoever keeps a mask across steps takes a copy. Position rows are never
written after they are made.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: decode steps whose position ids one table holds
CHUNK = 64


class StepInputs:
    """The mask and positions of decode steps after a prompt (``pad``: each row's right
    padding, int64 [batch]; ``width``: the widest mask a step feeds)."""

    def __init__(self, pad: np.ndarray, width: int, mask_dtype: Any, positions_rank: int) -> None:
        self._pad = pad
        self._padded = bool(pad.any())
        self._rows = np.arange(pad.shape[0])
        self._width = width
        self._mask_dtype = mask_dtype
        self._buf: np.ndarray | None = None
        self._buf_past = -1  # the ``past`` the buffer's ones are for
        self._rank = positions_rank
        self._table: np.ndarray | None = None
        self._table_from = 0

    def mask(self, past: int, width: int) -> np.ndarray:
        """The mask ``[batch, width]`` of the step after ``past`` fed tokens (see the module:
        a view, valid until the next call)."""
        if not 0 <= past < width <= self._width:
            raise ValueError(f"a mask of {width} columns after {past} tokens: outside the buffer")
        buf = self._buf
        if buf is None or past not in (self._buf_past, self._buf_past + 1):
            cols = np.arange(self._width)[None]
            buf = self._buf = (cols < (past + 1 - self._pad)[:, None]).astype(self._mask_dtype)
        elif past != self._buf_past:
            # one more real token a row: its column becomes a one (zeros after it stay)
            if self._padded:
                buf[self._rows, past - self._pad] = 1
            else:
                buf[:, past] = 1
        self._buf_past = past
        view = buf[:, :width]
        return view if buf.shape[0] == 1 else np.ascontiguousarray(view)

    def positions(self, past: int) -> np.ndarray:
        """The position ids of the step after ``past`` fed tokens: ``[batch, 1]``, or
        ``[3, batch, 1]`` for rank-3 (multimodal rotary) positions; never written later."""
        k = past - self._table_from
        table = self._table
        if table is None or not 0 <= k < table.shape[0]:
            steps = past + np.arange(CHUNK)[:, None] - self._pad[None]  # [CHUNK, batch]
            table = steps[:, :, None]
            if self._rank != 2:
                table = np.repeat(table[:, None], 3, axis=1)
            self._table = table = np.ascontiguousarray(table, dtype=np.int64)
            self._table_from, k = past, 0
        return table[k]
