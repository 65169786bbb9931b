"""Builders shared by the hot elementwise ops: the raw kernel, with the generic kernel behind it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from onnxep.providers import NodeInfo

from ..elementwise import binary_runner, unary_runner

Builder = Callable[[NodeInfo, Any], Callable[..., tuple]]


def fast_binary(op: str, node: NodeInfo, xp: Any, generic: Builder) -> Callable[..., tuple]:
    fallback = generic(node, xp)
    if node.opset < 7 and node.attr("broadcast", 0):
        return fallback  # the legacy axis-aligned broadcast: the generic kernel handles it
    return binary_runner(op, fallback)


def fast_unary(op: str, node: NodeInfo, xp: Any, generic: Builder) -> Callable[..., tuple]:
    return unary_runner(op, generic(node, xp))
