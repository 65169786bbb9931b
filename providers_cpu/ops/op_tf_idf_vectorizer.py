"""TfIdfVectorizer: n-gram (with skips) counts against a fixed pool, optionally IDF-weighted."""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .misc import str_list, to_str


def _pool(node: NodeInfo) -> tuple[dict[tuple, int], bool]:
    """Map every pool n-gram (a tuple) to its position in the pool."""
    strings = node.attr("pool_strings", None)
    ints = node.attr("pool_int64s", None)
    if (strings is None) == (ints is None):
        raise NotSupported("TfIdfVectorizer: exactly one of pool_strings / pool_int64s must be set")
    items = (
        str_list(strings) if strings is not None else [int(v) for v in np.asarray(ints).reshape(-1)]
    )
    starts = [int(c) for c in node.attr("ngram_counts")]
    table: dict[tuple, int] = {}
    j = 0
    for level, begin in enumerate(starts):
        n = level + 1
        end = starts[level + 1] if level + 1 < len(starts) else len(items)
        for k in range(begin, end, n):
            table[tuple(items[k : k + n])] = j
            j += 1
    return table, strings is not None


@kernel("TfIdfVectorizer", since=9)
def tf_idf_vectorizer(node: NodeInfo, xp: Any):
    mode = to_str(node.attr("mode"))
    if mode not in ("TF", "IDF", "TFIDF"):
        raise NotSupported(f"TfIdfVectorizer: mode {mode!r} is not TF, IDF or TFIDF")
    lo = int(node.attr("min_gram_length"))
    hi = int(node.attr("max_gram_length"))
    max_skip = int(node.attr("max_skip_count"))
    indexes = np.asarray(node.attr("ngram_indexes"), dtype=np.int64).reshape(-1)
    table, is_str = _pool(node)
    npool = len(table)
    weights = node.attr("weights", None)
    weights = np.ones(npool, np.float32) if weights is None else np.asarray(weights, np.float32)
    width = int(indexes.max()) + 1 if indexes.size else 0
    used = min(npool, indexes.size)
    lengths = [n for n in range(max(lo, 1), hi + 1)]

    def count_row(row: list) -> np.ndarray:
        counts = np.zeros(npool, np.float32)
        c = len(row)
        for start in range(c):
            for n in lengths:
                # A unigram is the same for every skip: count it once.
                for skip in range(max_skip + 1 if n > 1 else 1):
                    step = skip + 1
                    last = start + (n - 1) * step
                    if last >= c:
                        break
                    j = table.get(tuple(row[start : last + 1 : step]))
                    if j is not None:
                        counts[j] += 1
        return counts

    def run(x):
        a = np.asarray(x)
        rows = a.reshape(1, -1) if a.ndim <= 1 else a.reshape(a.shape[0], -1)
        out = np.zeros((rows.shape[0], width), np.float32)
        for r in range(rows.shape[0]):
            row = [to_str(v) for v in rows[r]] if is_str else [int(v) for v in rows[r]]
            counts = count_row(row)
            if mode == "IDF":
                counts = np.minimum(counts, 1) * weights
            elif mode == "TFIDF":
                counts = counts * weights
            np.add.at(out[r], indexes[:used], counts[:used])
        return (out.reshape(-1) if a.ndim <= 1 else out,)

    return run
