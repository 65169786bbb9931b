"""What the cuDNN kernels (op_conv, op_conv_transpose, op_fused_conv, the pools) share.

- :func:`build_refusal`: why a node never reaches cuDNN (cuDNN missing, a static dtype
  it does not take, a rank it has no descriptor for), known when the kernel is built;
  such a node runs its generic kernel, marked as its generic kernel is (Conv's is not
  capture-safe: it calls CuPy's cuBLAS wrappers).
- :class:`PerShape`: the per-(shapes, dtype) cache of plans and cuDNN objects, which
  also counts the calls handed to the generic kernel at run time and says why
  (``reasons``), since a shape the plan refuses is only known then.
- :func:`padded`: the explicit padding of an input ahead of cuDNN's symmetric pads, as
  one fill and one strided copy (both capture-safe CuPy kernels).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable
from typing import Any

from ..declines import CUPY_BLAS_NOTE

_log = logging.getLogger("onnxep.cuda.cudnn")


def build_refusal(node: Any, op: str, spatial: int | None) -> str | None:
    """Why every run of this node goes to the generic kernel, or None."""
    from .. import dnn

    reason = dnn.unavailable_reason()
    if reason is not None:
        return f"{op}: cuDNN is unavailable ({reason})"
    x = node.inputs[0] if node.inputs else None
    dt = getattr(x, "dtype", None)
    if dt is not None and dt.name not in dnn.SUPPORTED_DTYPES:
        return f"{op}: dtype {dt.name} (cuDNN is used for float16, float32 and float64)"
    if spatial is not None and spatial not in (1, 2, 3):
        return f"{op}: {spatial} spatial dims (cuDNN takes 1, 2 or 3)"
    return None


def generic_note(why: str) -> str:
    """The capture note of a Conv-family node left on its generic kernel."""
    return f"{why}; {CUPY_BLAS_NOTE}"


class PerShape:
    """Objects built once per key (shapes, dtype), or the reason the key falls back."""

    def __init__(self, op: str, name: str) -> None:
        self.op = op
        self.name = name
        self._entries: dict[Hashable, Any] = {}
        #: reason -> calls handed to the generic kernel for it
        self.reasons: dict[str, int] = {}

    def get(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """The entry for ``key``: ``build()``'s value, or the string it returned (a fallback)."""
        entry = self._entries.get(key)
        if entry is None:
            from .. import dnn

            try:
                entry = build()
            except dnn.DnnError as exc:
                if not exc.not_supported:
                    raise
                entry = f"cuDNN refused it: {exc}"
            self._entries[key] = entry
            if isinstance(entry, str):
                _log.info("%s %r: generic kernel for %s: %s", self.op, self.name, key, entry)
        return entry

    def refuse(self, key: Hashable, reason: str) -> None:
        """Remember that ``key`` falls back (cuDNN refused its first call)."""
        self._entries[key] = reason
        _log.info("%s %r runs its generic kernel for %s: %s", self.op, self.name, key, reason)

    def fell_back(self, reason: str) -> None:
        self.reasons[reason] = self.reasons.get(reason, 0) + 1


def padded(xp: Any, x: Any, pre_pad: Any, value: float) -> Any:
    """``x`` with ``pre_pad`` ((begin, end) per spatial axis) cells of ``value`` around it."""
    if pre_pad is None:
        return xp.ascontiguousarray(x)
    shape = (*x.shape[:2], *(d + a + b for d, (a, b) in zip(x.shape[2:], pre_pad)))
    out = xp.full(shape, value, dtype=x.dtype)
    inner = tuple(slice(a, a + d) for d, (a, _b) in zip(x.shape[2:], pre_pad))
    out[(slice(None), slice(None), *inner)] = x
    return out


def contiguous(xp: Any, x: Any, shape: tuple[int, ...]) -> Any:
    """``x`` C-contiguous with ``shape`` (a reshape of the same element count)."""
    return xp.ascontiguousarray(x).reshape(shape)
