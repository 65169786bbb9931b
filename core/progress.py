"""Progress bars (tqdm) for long loops, shown only where a person is watching.

``progress=True`` always shows the bar, ``False`` never does, and ``None``
shows it when the loop has at least ``min_total`` steps and stderr is a
terminal, so logs, pipes and CI stay clean. tqdm is imported only when a
bar is shown.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

logger = logging.getLogger("onnxep")

#: loops shorter than this finish before a bar would tell anyone anything
DEFAULT_MIN_TOTAL = 64


def wants_bar(progress: bool | None, total: int, min_total: int = DEFAULT_MIN_TOTAL) -> bool:
    """Whether a loop of ``total`` steps shows a bar (see the module's note)."""
    if progress is not None:
        return bool(progress)
    if total < min_total:
        return False
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


class _NoBar:
    """What a loop updates when no bar is shown."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(
    total: int,
    progress: bool | None,
    desc: str,
    unit: str = "it",
    min_total: int = DEFAULT_MIN_TOTAL,
) -> Any:
    """A tqdm bar on stderr, or an object with the same ``update``/``close`` that shows nothing."""
    if not wants_bar(progress, total, min_total):
        return _NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        logger.warning("tqdm is not installed, so no progress bar is shown (pip install tqdm)")
        return _NoBar()
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False, dynamic_ncols=True)
