"""Outputs never share memory with the caller's feeds or with buffers the session keeps.

A kernel may return one of its inputs or a view of it (Identity, Reshape,
Squeeze, Transpose, Slice, Split...), and kernels do not declare which, so a
step is presumed able to hand back (a view of) any input it does not read
as a host-side parameter (shapes, axes, k: ``KernelSpec.host_inputs``); a
step that runs subgraphs (If, Loop, Scan) may hand back any of its inputs.
Walking the plan once tells, for each graph output, which protected buffers
it may reach:

- FEED: the caller's arrays (writing into the output would change them);
- CONST: the plan's constants (initializers, folded values), shared by runs;
- KEPT: values reused by later runs: the shape cache's, and what a kernel
  without inputs hands back (Constant returns the same array every run).

An output that *is* a feed or a constant, or repeats an earlier output, is
always copied. One that may be a view of a protected buffer is checked per
run: the root of its ``.base`` chain is compared with the roots of the
buffers it may reach, and the output copied on a match. Outputs that reach
none are returned as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..compile.plan import NONE_SLOT, SINK_SLOT, Plan, Step

FEED, CONST, KEPT = 1, 2, 4


@dataclass(frozen=True)
class OutputRule:
    """How one graph output leaves a run: copied, or checked against some buffers' roots."""

    slot: int
    copy: bool = False
    check: int = 0  # FEED | CONST | KEPT: whose roots to compare with at run time

    @property
    def checked(self) -> bool:
        return not self.copy and bool(self.check)


def keeps_output(step: Step) -> bool:
    """A kernel without inputs may hand out the same array on every run."""
    return step.kind == "kernel" and not step.inputs


def origins(plan: Plan, protect_feeds: bool = True) -> dict[int, int]:
    """Slot -> the protected buffers (FEED | CONST | KEPT) its value may share memory with."""
    reach: dict[int, int] = {}
    if protect_feeds:
        for s in plan.input_slots:
            reach[s] = FEED
    for s, value in enumerate(plan.template):
        if value is not None and s not in (NONE_SLOT, SINK_SLOT):
            reach[s] = CONST
    for step in plan.steps:
        mask = KEPT if step.shape_only or keeps_output(step) else 0
        for i in step.views_of:
            mask |= reach.get(step.inputs[i], 0)
        for s in step.outputs:
            if s != SINK_SLOT:
                reach[s] = mask
    return reach


def output_rules(plan: Plan, protect_feeds: bool = True) -> tuple[OutputRule, ...]:
    """One rule per graph output of ``plan``.

    ``protect_feeds`` is off for a subgraph: its feeds are its parent's values,
    which the parent's own rules account for (a step running a subgraph is
    presumed to hand back any of its inputs).
    """
    reach = origins(plan, protect_feeds)
    feeds = set(plan.input_slots) if protect_feeds else set()
    seen: set[int] = set()
    rules = []
    for s in plan.output_slots:
        if s in seen or s in feeds or plan.template[s] is not None:
            rules.append(OutputRule(s, copy=True))
        else:
            rules.append(OutputRule(s, check=reach.get(s, 0)))
        seen.add(s)
    return tuple(rules)


def root(x: Any) -> Any:
    """The object that owns ``x``'s memory: the end of its ``.base`` chain."""
    base = getattr(x, "base", None)
    while base is not None:
        x = base
        base = getattr(x, "base", None)
    return x


def root_id(x: Any) -> int:
    return id(root(x))


def root_ids(values: Iterable[Any]) -> frozenset[int]:
    return frozenset(id(root(v)) for v in values if v is not None)


def fresh(x: Any) -> Any:
    """A copy of ``x`` the caller may write into (a list is copied element by element)."""
    if x is None:
        return None
    if isinstance(x, list):
        return [fresh(v) for v in x]
    copy = getattr(x, "copy", None) or getattr(x, "clone", None)  # NumPy, CuPy / torch
    return copy() if copy is not None else x


def guard(x: Any, *roots: Any) -> Any:
    """``x``, or a copy of it when its memory belongs to a buffer in one of ``roots``."""
    i = id(root(x))
    for r in roots:
        if i in r:
            return fresh(x)
    return x


def apply_rules(
    rules: Sequence[OutputRule],
    outs: Sequence[Any],
    feeds: Sequence[Any],
    const_roots: frozenset[int],
    kept_roots: frozenset[int],
) -> list[Any]:
    """The run's outputs as the caller gets them (the checked and profiled paths)."""
    feed_roots = root_ids(feeds) if any(r.check & FEED for r in rules) else frozenset()
    by_kind = ((FEED, feed_roots), (CONST, const_roots), (KEPT, kept_roots))
    result = []
    for rule, x in zip(rules, outs):
        if rule.copy:
            x = fresh(x)
        elif rule.check:
            x = guard(x, *[r for kind, r in by_kind if rule.check & kind])
        result.append(x)
    return result
