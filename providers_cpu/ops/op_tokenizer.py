"""com.microsoft Tokenizer: strings split into tokens, padded to the longest row.

What skl2onnx writes for scikit-learn's text vectorizers (before TfIdfVectorizer). As
onnxruntime 1.2x+ does it:

- ``tokenexp``: the tokens are the regular expression's non-empty matches, left to right;
- otherwise ``separators``, each a regular expression, split every token in the order they
  are listed (the first splits the string, the second each piece, ...); a single empty
  separator means one token per character;
- tokens shorter than ``mincharnum`` characters are dropped, empty ones always;
- ``mark`` puts U+0002 before and U+0003 after each row's tokens; then ``pad_value``
  fills the row up to the longest row. X of shape [C] or [N, C] gives [C, T] or
  [N, C, T]; when no row has a token, T is 0.

onnxruntime matches with RE2, whose ``\\w``, ``\\d``, ``\\s`` and ``\\b`` are ASCII-only, so the
expressions are compiled with ``re.ASCII``. RE2 refuses look-arounds and back-references;
Python's ``re`` accepts them, so such a model runs here and not in onnxruntime.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument, NotSupported
from onnxep.providers.kernel import kernel

from ._misc import as_str_array, str_list, to_str

_START, _END = "\x02", "\x03"


def _compile(pattern: str, what: str) -> re.Pattern:
    try:
        return re.compile(pattern, re.ASCII)
    except re.error as exc:
        raise NotSupported(
            f"Tokenizer: {what} {pattern!r} is not a valid expression: {exc}"
        ) from None


@kernel("Tokenizer", since=1, domain="com.microsoft", dtypes=("string",))
def tokenizer(node: Any, xp: Any):
    for name in ("mark", "mincharnum", "pad_value"):
        if node.attr(name, None) is None:
            raise NotSupported(f"Tokenizer: the required attribute {name!r} is missing")
    mark = bool(node.attr("mark"))
    mincharnum = int(node.attr("mincharnum"))
    pad = to_str(node.attr("pad_value"))
    tokenexp = node.attr("tokenexp", None)
    separators = str_list(node.attr("separators", None))
    if tokenexp is not None and to_str(tokenexp):
        expr = _compile(to_str(tokenexp), "tokenexp")

        def split(s: str) -> list[str]:
            return [m.group(0) for m in expr.finditer(s) if m.group(0)]

    elif separators == [""]:
        if mincharnum > 1:
            raise NotSupported("Tokenizer: mincharnum above 1 with per-character tokens")

        def split(s: str) -> list[str]:
            return list(s)

    elif separators:
        if any(not s for s in separators):
            raise NotSupported("Tokenizer: an empty separator is only allowed alone")
        exprs = [_compile(s, "separator") for s in separators]

        def split(s: str) -> list[str]:
            parts = [s]
            for e in exprs:
                parts = [p for part in parts for p in e.split(part) if p]
            return parts

    else:
        raise NotSupported("Tokenizer: needs a tokenexp or at least one separator")

    def run(x):
        if x.ndim not in (1, 2) or 0 in x.shape:
            raise InvalidArgument(
                f"Tokenizer: X must be [C] or [N, C] and not empty, got {x.shape}"
            )
        rows = [[t for t in split(s) if len(t) >= mincharnum] for s in as_str_array(x).ravel()]
        width = max(len(r) for r in rows)
        if width == 0:
            return (np.empty((*x.shape, 0), dtype=object),)
        width += 2 * mark
        out = np.empty((len(rows), width), dtype=object)
        for i, r in enumerate(rows):
            r = [_START, *r, _END] if mark else r
            out[i] = r + [pad] * (width - len(r))
        return (out.reshape(*x.shape, width),)

    return run
