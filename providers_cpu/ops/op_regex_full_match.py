"""RegexFullMatch: whether each string matches a pattern as a whole.

ONNX names RE2 syntax; Python's ``re`` agrees with it on the common subset.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .misc import str_map, to_str


@kernel("RegexFullMatch", since=20)
def regex_full_match(node: NodeInfo, xp: Any):
    pattern = to_str(node.attr("pattern"))
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise NotSupported(f"RegexFullMatch: pattern {pattern!r} does not compile: {exc}") from None

    def run(x):
        return (str_map(lambda s: rx.fullmatch(s) is not None, x, np.bool_),)

    return run
