"""Runs rewrite passes until none changes the graph, honouring the switches.

A fusion pass bound to a provider is held to its contract after every call
(see :mod:`.contract`): when it rewrote nodes its provider does not own,
emitted an op its provider has no kernel for, or raised, its changes are
rolled back, it is left out of the remaining rounds, and the report lists it
in ``rejected`` (and its name in ``skipped``). The session stays usable;
whoever runs the manager reports the rejection.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx_ir as ir

from onnxep.providers.kernel import normalize_domain

from .base import FusionPass, RewritePass
from .contract import GraphState, contract_problems


@dataclass(frozen=True)
class RejectedPass:
    """A fusion pass whose changes were rolled back, and what it did wrong."""

    rewrite: Any
    name: str
    provider: str
    problems: tuple[str, ...]

    def __str__(self) -> str:
        return (
            f"fusion pass {self.name!r} for provider {self.provider!r} broke the rewrite "
            f"contract and was rolled back: {'; '.join(self.problems)}"
        )


@dataclass
class RewriteReport:
    counts: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    rejected: list[RejectedPass] = field(default_factory=list)


def _name(p: Any) -> str:
    return getattr(p, "name", "") or type(p).__name__


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
        report = RewriteReport(skipped=list(self.skipped))
        active = list(self.passes)
        # The model as the last guarded call left it (checked after that pass, or restored):
        # the next guarded call's "before", unless an unguarded pass ran in between.
        state: GraphState | None = None
        for _ in range(self.max_rounds):
            changed = False
            for p in list(active):
                if isinstance(p, FusionPass) and p.provider is not None:
                    modified, rejected, state = _guarded(p, model, state)
                    if rejected is not None:
                        active.remove(p)
                        report.rejected.append(rejected)
                        if rejected.name not in report.skipped:
                            report.skipped.append(rejected.name)
                        continue
                else:
                    modified = bool(p(model).modified)
                    state = None
                changed |= modified
            if not changed:
                break
        for p in self.passes:
            name = _name(p)
            report.counts[name] = report.counts.get(name, 0) + getattr(p, "count", 0)
        return report


def _guarded(
    p: FusionPass, model: ir.Model, now: GraphState | None = None
) -> tuple[bool, RejectedPass | None, GraphState]:
    """Run ``p``; on a broken contract, undo it and say why. ``now``: a snapshot of the model
    as it is (taken when None). Returns a snapshot of the model as ``p`` leaves it, which the
    next call can start from: one snapshot per pass call instead of two."""
    before = now if now is not None else GraphState(model)
    count = p.count
    try:
        modified = bool(p(model).modified)
    except Exception as exc:
        problems = [f"it raised {type(exc).__name__}: {exc}"]
    else:
        after = GraphState(model)
        problems = contract_problems(
            before, after, p.owns, p.provider.name, lambda n: _has_kernel(p, n)
        )
        if not problems:
            return modified, None, after
    before.restore(model)  # checks the model is ``before`` again, so it stays the snapshot
    p.count = count
    return False, RejectedPass(p, _name(p), p.provider.name, tuple(problems)), before


def _has_kernel(p: FusionPass, node: ir.Node) -> bool:
    return p.can_emit(normalize_domain(node.domain), node.op_type)
