"""``placement="measured"``: time the candidate placements of a model, keep the fastest.

The candidates (docs/placement.md):

- ``priority``: the provider list as given, each node on the first provider that
  claims it (what ``placement="priority"`` gives);
- ``cpu-only``: the CPU provider alone, every node on the host;
- ``islands-to-cpu``: the list as given, then each device island of fewer than
  ``island_nodes`` nodes moved to the CPU (``onnxep.compile.islands``).

Each candidate is compiled fresh from the model after the basic rewrites (its
own copy, its own fusions), checked against the ones before it (the same
node placement is timed once), warmed up (a run, or a capture policy's
warm-up and capturing runs), then the candidates are
run in turns, interleaved so that noise hits them alike, until the budget is
spent (at least one timed round, at most ``MAX_ROUNDS``). A candidate whose
fastest run is more than ``DROP_FACTOR`` times slower than another's median
stops early (and once one candidate is left, after three rounds, timing
ends). The fastest median wins; a candidate other than ``priority``
must beat it by more than ``margin`` (noise), else the list as given stays.
The plans measured are thrown away: the session compiles the chosen
candidate once more, so no captured graph, cache or counter of a timing run
is left behind.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from onnxep.providers import Provider

from .compile.placement import CandidateTiming, MeasuredPlacement
from .compiled_model import CompiledModel
from .errors import InvalidArgument, OnnxepError
from .model_io import NodeArg
from .random_feeds import random_feeds

__all__ = ["Candidate", "candidates", "measure", "timing_feeds"]

#: at most this many timed rounds, whatever the budget
MAX_ROUNDS = 30
#: a candidate whose fastest run is this many times another's median stops early
DROP_FACTOR = 4.0
#: a candidate other than the list as given must be this much faster to be chosen
MARGIN = 0.05


@dataclass(frozen=True)
class Candidate:
    """A placement to try: providers in priority order, and the island rule's size."""

    name: str
    rule: str
    providers: tuple[Provider, ...]
    island_nodes: int = 0


def candidates(
    providers: Sequence[Provider], host: Provider | None, island_nodes: int
) -> list[Candidate]:
    """The candidates for ``providers`` (the session's list, CPU last)."""
    given = tuple(providers)
    out = [Candidate("priority", "each node on the first provider that claims it", given)]
    if host is not None and any(p is not host for p in given):
        out.append(Candidate("cpu-only", "every node on the CPU provider", (host,)))
    if host is not None and island_nodes > 1 and any(p.device != "cpu" for p in given):
        out.append(
            Candidate(
                "islands-to-cpu",
                f"as priority, then device islands of fewer than {island_nodes} nodes "
                "between host nodes moved to the CPU",
                given,
                island_nodes,
            )
        )
    return out


def _signature(compiled: CompiledModel) -> tuple:
    return tuple((p.name, p.provider.name) for g in compiled.graphs for p in g.placed)


def _timing(c: Candidate, compiled: CompiledModel | None, **kw: Any) -> CandidateTiming:
    counts: dict[str, int] = {}
    copies = 0
    if compiled is not None:
        for g in compiled.graphs:
            for p in g.placed:
                counts[p.provider.name] = counts.get(p.provider.name, 0) + 1
            copies += len(g.plan.copies)
    names = tuple(p.name for p in c.providers)
    return CandidateTiming(c.name, c.rule, names, counts, copies, **kw)


def timing_feeds(
    inputs: Sequence[NodeArg],
    graph: Any,
    model_path: str | None,
    dims: Mapping[str, int],
    shapes: Mapping[str, Sequence[int]],
    int_ranges: Mapping[str, tuple[int, int]],
) -> dict[str, Any]:
    """Random feeds for timing, as the CLI's ``--shape``/``--int-range`` make them (symbolic
    dims: ``dims``, else 1); refused, naming the input, where one cannot be made."""
    how = (
        "give its shape with SessionOptions.placement_shapes={name: [dims]} "
        "(onnxep explain --shape NAME=D0,D1), or use placement='priority'"
    )
    for arg in inputs:
        if not arg.type.startswith("tensor("):
            raise InvalidArgument(
                f"placement='measured' cannot make a timing feed for input {arg.name!r}: it "
                f"is {arg.type}, and only tensors are made; use placement='priority'"
            )
        if arg.shape is None and arg.name not in shapes:
            raise InvalidArgument(
                f"placement='measured' cannot make a timing feed for input {arg.name!r}: the "
                f"model does not declare its rank; {how}"
            )
    try:
        return random_feeds(
            inputs, graph, model_path, dims, shapes=shapes, int_ranges=int_ranges, given={}
        )
    except InvalidArgument as exc:
        raise InvalidArgument(
            f"placement='measured' cannot make its timing feeds: {exc}; {how}"
        ) from None


def measure(
    cands: Sequence[Candidate],
    build: Callable[[Candidate], CompiledModel],
    feeds_for: Callable[[CompiledModel], dict[str, Any]],
    budget_ms: float,
    island_nodes: int,
    margin: float = MARGIN,
) -> tuple[Candidate, MeasuredPlacement]:
    """Time ``cands`` (the first is the list as given) and return the one to keep."""
    timings: dict[str, CandidateTiming] = {}
    live: list[tuple[Candidate, CompiledModel]] = []
    seen: dict[tuple, str] = {}
    for c in cands:
        t0 = time.perf_counter()
        try:
            compiled = build(c)
        except OnnxepError as exc:
            if c is cands[0]:
                raise  # the session would fail the same way without measuring
            timings[c.name] = _timing(c, None, skipped=f"not timed: it does not compile: {exc}")
            continue
        kw = {"compile_ms": (time.perf_counter() - t0) * 1e3}
        sig = _signature(compiled)
        if sig in seen:
            kw["skipped"] = f"not timed: the same placement as {seen[sig]!r}"
            timings[c.name] = _timing(c, compiled, **kw)
            continue
        seen[sig] = c.name
        timings[c.name] = _timing(c, compiled, **kw)
        live.append((c, compiled))
    names = [c.name for c in cands]
    if len(live) == 1:
        only = live[0][0]
        report = MeasuredPlacement(
            only.name,
            "it is the only distinct placement, so nothing was timed",
            budget_ms,
            0.0,
            island_nodes,
            margin,
            {},
            tuple(timings[n] for n in names),
        )
        return only, report

    feeds = feeds_for(live[0][1])
    shown = {k: f"{v.dtype}{list(v.shape)}" for k, v in feeds.items()}
    times: dict[str, list[float]] = {c.name: [] for c, _ in live}
    warm: dict[str, float] = {}
    t_runs = time.perf_counter()  # the budget covers the warm-up runs and the timed ones
    # Warm-up: first-run costs (kernels' lazy setup, and under a capture policy its eager
    # runs and the capturing one) are not what a run costs; the timed runs replay.
    for c, compiled in list(live):
        t0 = time.perf_counter()
        try:
            for _ in range(warmup_runs(compiled)):
                compiled.run(feeds)
        except OnnxepError as exc:
            if c is cands[0]:
                raise InvalidArgument(
                    f"placement='measured' could not run the model on its timing feeds "
                    f"({', '.join(f'{k} {v}' for k, v in shown.items())}): {exc}; give the "
                    "inputs' shapes with SessionOptions.placement_shapes (and integer inputs' "
                    "values with placement_int_ranges), or use placement='priority'"
                ) from exc
            live.remove((c, compiled))
            timings[c.name] = dataclasses.replace(
                timings[c.name], skipped=f"not timed: its run failed: {exc}"
            )
            continue
        warm[c.name] = (time.perf_counter() - t0) * 1e3
    dropped: dict[str, str] = {}
    rounds = 0
    while (
        live
        and rounds < MAX_ROUNDS
        and (rounds == 0 or (time.perf_counter() - t_runs) * 1e3 < budget_ms)
    ):
        # Turn order rotates each round, so no candidate always runs right after another.
        k = rounds % len(live)
        for c, compiled in live[k:] + live[:k]:
            t0 = time.perf_counter()
            try:
                compiled.run(feeds)
            except OnnxepError as exc:
                if c is cands[0]:
                    raise
                live.remove((c, compiled))
                dropped[c.name] = f"stopped: a timed run failed: {exc}"
                continue
            times[c.name].append((time.perf_counter() - t0) * 1e3)
        rounds += 1
        medians = {n: statistics.median(t) for n, t in times.items() if t}
        best = min(medians, key=medians.__getitem__)
        for c, compiled in list(live):
            if c.name != best and min(times[c.name]) > DROP_FACTOR * medians[best]:
                dropped[c.name] = (
                    f"stopped after {len(times[c.name])} run(s): its fastest run took over "
                    f"{DROP_FACTOR:g}x the median of {best!r}"
                )
                live.remove((c, compiled))
        if len(live) < 2 and rounds >= 3:
            break  # the rest stopped early: nothing left to compare the last one with
    spent_ms = (time.perf_counter() - t_runs) * 1e3
    for name, t in times.items():
        extra = {"skipped": dropped[name]} if name in dropped else {}
        timings[name] = dataclasses.replace(
            timings[name], warmup_ms=warm.get(name), times_ms=tuple(t), **extra
        )
    medians = {n: statistics.median(t) for n, t in times.items() if t}
    chosen, reason = _choose(medians, cands[0].name, margin)
    budget_note = (
        f" (the {budget_ms:g} ms budget allowed {max(map(len, times.values()))} round(s); "
        "raise placement_budget_ms for more)"
        if max(map(len, times.values())) < 3
        else ""
    )
    report = MeasuredPlacement(
        chosen,
        reason + budget_note,
        budget_ms,
        spent_ms,
        island_nodes,
        margin,
        shown,
        tuple(timings[n] for n in names),
    )
    return next(c for c in cands if c.name == chosen), report


def warmup_runs(compiled: CompiledModel) -> int:
    """Runs before timing: one, or a capture policy's eager runs and its capturing run."""
    return 1 if compiled.capture is None else compiled.capture.config.warmup + 1


def _choose(medians: Mapping[str, float], given: str, margin: float) -> tuple[str, str]:
    """The fastest candidate, and why; the list as given unless beaten by over ``margin``."""
    best = min(medians, key=medians.__getitem__)
    if best == given:
        others = [f"{n} {m:.3f} ms" for n, m in medians.items() if n != given]
        return given, (
            f"the list as given was fastest (median {medians[given]:.3f} ms; "
            + ", ".join(others)
            + ")"
        )
    if given not in medians:
        return best, f"fastest of the placements timed (median {medians[best]:.3f} ms)"
    ratio = medians[given] / medians[best] if medians[best] > 0 else float("inf")
    if medians[best] > medians[given] * (1 - margin):
        return given, (
            f"{best!r} (median {medians[best]:.3f} ms) was not over {margin:.0%} faster than "
            f"the list as given ({medians[given]:.3f} ms), so the list as given stays"
        )
    return best, (
        f"median {medians[best]:.3f} ms, {ratio:.2f}x faster than the list as given "
        f"({medians[given]:.3f} ms)"
    )
