"""Runs rewrite passes until none changes the graph, honouring the switches."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import onnx_ir as ir

from .base import RewritePass


@dataclass
class RewriteReport:
    counts: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)


class RewriteManager:
    """Repeat ``passes`` in order until a full round changes nothing (at most ``max_rounds``)."""

    def __init__(
        self,
        passes: Sequence[RewritePass],
        disabled: Iterable[str] = (),
        max_rounds: int = 8,
    ) -> None:
        off = set(disabled)
        self.passes = [p for p in passes if getattr(p, "name", "") not in off]
        self.skipped = [getattr(p, "name", "") for p in passes if getattr(p, "name", "") in off]
        self.max_rounds = max_rounds

    def run(self, model: ir.Model) -> RewriteReport:
        for _ in range(self.max_rounds):
            changed = False
            for p in self.passes:
                changed |= bool(p(model).modified)
            if not changed:
                break
        counts: dict[str, int] = {}
        for p in self.passes:
            name = getattr(p, "name", type(p).__name__)
            counts[name] = counts.get(name, 0) + getattr(p, "count", 0)
        return RewriteReport(counts, self.skipped)
