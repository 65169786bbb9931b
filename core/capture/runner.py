"""Running a plan through captured graphs: warm-up, capture, replay, fallback, counters.

A session uses :class:`CapturedRunner` in place of ``Executor.run`` when a
provider's ``onnxep_capture_policy`` hook returns a :class:`CaptureConfig`
whose mode is not ``off``. The device side (begin/end capture, launch, the
private memory pool) is the config's :class:`CaptureBackend`; this module
only decides what runs when, so a fake backend tests it on the CPU.

Per key (the graph id from ``RunOptions`` and every feed's shape and dtype):
the first ``warmup`` runs are eager (kernels' lazy per-signature setup
happens outside capture), the next one captures each segment and launches
it, and later runs replay. Feeds are copied into the fixed buffers the
graphs read, except the device feeds the caller names ``in_place`` (IO
binding's buffers bound as both an input and an output: a KV cache): the
graphs read and write those arrays where they are, so a replay copies no
cache. Such an entry holds a reference to each of those arrays (its graphs
never touch memory it does not keep alive) and its key adds their data
pointers and strides, so other buffers never replay it: they capture anew
(``rebinds``), without a new warm-up, within the LRU cache. Seams run
eagerly and their results read by a later graph are copied into the buffers
that graph was captured with. A capture that raises
is ended cleanly and discarded: the run is redone eagerly, the step that
failed becomes a seam with the reason, and the next capture uses the new
segmentation. A seam whose result changes shape invalidates the entry.
Captured runs of one session are serialized (they share fixed buffers).
Outputs of ``run`` are fresh host arrays; ``run_on_device`` hands back copies
of the graph's output buffers, except on IO binding's sharing path, which
copies bound outputs into their buffers itself (none when the graph wrote
the bound buffer in place: GroupQueryAttention's present IS the past read in
place) and hands unbound ones over as the graph's buffers: those are
overwritten by the next replay, as onnxruntime's graph outputs are.
"""

from __future__ import annotations

import operator
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from onnxep.providers.capture import CaptureBackend, CaptureConfig
from onnxep.providers.inplace import not_donating

from ..compile.plan import HOST, Plan
from ..errors import ConfigError
from .plan import CapturePlan, Segment, plan_capture

#: ``RunOptions`` config key onnxruntime uses for the graph id; -1 skips capture.
GRAPH_ID_KEY = "gpu_graph_id"


@dataclass
class CaptureStats:
    captures: int = 0
    replays: int = 0
    fallbacks: int = 0
    invalidations: int = 0
    #: captures for shapes whose graph on other in-place buffers is still cached
    rebinds: int = 0
    #: copies replays made: feeds into fixed buffers, seam results, device outputs duplicated
    copies: int = 0
    segments: int = 0
    policy: str = "off"
    reason: str = ""
    failures: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__, failures=list(self.failures))


class CaptureFailed(Exception):
    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index = index
        self.reason = reason


class Invalidated(Exception):
    """A seam's result no longer fits the buffer a graph was captured with."""


def graph_id_of(run_options: Any) -> int:
    """The graph id a run asks for: onnxruntime's ``gpu_graph_id`` config entry, else 0."""
    entries = getattr(run_options, "config_entries", None) or {}
    raw = entries.get(GRAPH_ID_KEY, 0)
    try:
        gid = int(raw)
    except (TypeError, ValueError):
        raise ConfigError(
            f"RunOptions entry {GRAPH_ID_KEY!r} must be an integer (-1 skips capture), got {raw!r}"
        ) from None
    if gid < -1:
        raise ConfigError(f"RunOptions entry {GRAPH_ID_KEY!r} must be -1 or more, got {gid}")
    return gid


def _donation(sched: _Schedule) -> AbstractContextManager:
    """Keep the run's donated buffers (``onnxep.providers.inplace``) only for a plan captured
    as one graph. A step that updates a state in place must run once per run, and a run
    whose capture fails after an earlier graph or seam ran, or whose seam gives a result a
    replay cannot take, is redone eagerly; one graph fails before anything of it runs."""
    return nullcontext() if [kind for kind, _ in sched.parts] == ["graph"] else not_donating()


def _signature(x: Any) -> tuple:
    shape = getattr(x, "shape", None)
    dtype = getattr(x, "dtype", None)
    if shape is None:
        return (type(x).__name__, repr(x) if x is None or np.isscalar(x) else id(x))
    return (tuple(shape), dtype)  # a dtype object hashes and compares; str() costs 3 us a feed


class _Schedule:
    """One variant's capture plan turned into parts: ("graph", segment) or ("eager", step)."""

    def __init__(self, plan: Plan, cplan: CapturePlan) -> None:
        self.plan = plan
        self.cplan = cplan
        roles = cplan.roles
        self.stages = [r.index for r in roles if r.role == "stage"]
        self.parts: list[tuple[str, Any]] = []
        seg_at = {s.start: s for s in cplan.segments}
        i = 0
        while i < len(roles):
            seg = seg_at.get(i)
            if seg is not None:
                self.parts.append(("graph", seg))
                i = seg.stop
                continue
            if roles[i].role != "stage":
                self.parts.append(("eager", i))
            i += 1
        # Slots a graph reads that a step outside it writes: refreshed after each eager part.
        produced_in: dict[int, int] = {}
        for k, (kind, what) in enumerate(self.parts):
            idxs = self._indices(kind, what)
            for i in idxs:
                for s in plan.steps[i].outputs:
                    produced_in[s] = k
        self.graph_reads: set[int] = set()
        for k, (kind, what) in enumerate(self.parts):
            if kind != "graph":
                continue
            for i in self._indices(kind, what):
                self.graph_reads.update(
                    s for s in plan.steps[i].inputs if produced_in.get(s, k) != k
                )
        self.output_steps = {r.index for r in roles if r.role == "output"}
        #: uploads of shape-only values: done by the backend from memory it keeps
        self.constants = {
            r.index
            for r in roles
            if r.role == "frozen"
            and plan.steps[r.index].kind == "copy"
            and plan.steps[r.index].provider != HOST
        }

    def _indices(self, kind: str, what: Any) -> list[int]:
        if kind == "eager":
            return [what]
        return [i for i in range(what.start, what.stop) if self.cplan.roles[i].role != "stage"]

    def segment_steps(self, seg: Segment) -> list[int]:
        return self._indices("graph", seg)


@dataclass
class _Entry:
    schedule: _Schedule
    memory: Any
    state: list
    graphs: dict[int, Any] = field(default_factory=dict)  # part index -> graph
    pinned: dict[int, Any] = field(default_factory=dict)  # slot -> buffer a graph reads
    #: input slot -> the caller's device array the graphs read and write in place; the
    #: reference keeps its memory alive as long as the graphs that bake its address in
    bound: dict[int, Any] = field(default_factory=dict)


class CapturedRunner:
    """Runs a plan's captured variants; falls back to ``eager`` (the executor) whenever
    capture does not apply."""

    def __init__(
        self,
        plan: Plan,
        config: CaptureConfig,
        eager: Callable[[Sequence[Any], bool, bool], list[Any]],
        contexts: Callable[[], AbstractContextManager[Any]] | None = None,
    ) -> None:
        self.config = config
        self._eager = eager
        self._contexts = contexts or nullcontext
        self._plans = {False: plan, True: plan.on_device()}
        self._forced: dict[bool, dict[int, str]] = {False: {}, True: {}}
        self._schedules: dict[bool, _Schedule] = {}
        self._backend: CaptureBackend | None = None
        self._cache: OrderedDict[tuple, _Entry] = OrderedDict()
        #: warm-up runs per key not captured yet (bounded: feeds of ever-new shapes)
        self._warm: OrderedDict[tuple, int] = OrderedDict()
        #: the in-place feeds of the last run and their places (see ``_places``)
        self._last_places: tuple | None = None
        self._lock = threading.Lock()
        self.stats = CaptureStats()
        host = self._schedule(False).cplan
        self.stats.policy, self.stats.reason = host.mode, self._reason(host)
        self.stats.segments = len(host.segments)

    def _reason(self, cplan: CapturePlan) -> str:
        return f"{cplan.reason} (capture={cplan.requested!r} from the {self.config.source})"

    def _schedule(self, on_device: bool) -> _Schedule:
        sched = self._schedules.get(on_device)
        if sched is None:
            cplan = plan_capture(
                self._plans[on_device],
                self.config.capturing,
                self.config.mode,
                self._forced[on_device],
            )
            sched = self._schedules[on_device] = _Schedule(self._plans[on_device], cplan)
        return sched

    @property
    def capture_plan(self) -> CapturePlan:
        return self._schedule(False).cplan

    def run(
        self,
        feeds: Sequence[Any],
        graph_id: int = 0,
        on_device: bool = False,
        protect: bool = True,
        in_place: Collection[int] = (),
    ) -> list[Any]:
        """Run ``feeds`` (in the plan's input order). ``in_place``: positions of feeds the
        graphs may read and write where they are (only device arrays are taken so)."""
        sched = self._schedule(on_device)
        if graph_id == -1 or sched.cplan.mode == "off":
            return self._eager(feeds, on_device, protect)
        shapes = (graph_id, on_device, protect, tuple(_signature(f) for f in feeds))
        with self._lock:
            places = self._places(feeds, in_place) if in_place else ()
            key = (*shapes, places)
            entry = self._cache.get(key)
            warming = False
            if entry is None:
                # Warm-up is per shapes: kernels' setup does not depend on which buffers.
                seen = self._warm.get(shapes, 0)
                warming = seen < self.config.warmup
                if warming:
                    self._warm[shapes] = seen + 1
                    while len(self._warm) > 4 * self.config.cache_size + 16:
                        self._warm.popitem(last=False)
                else:
                    if places and any(k[:4] == shapes for k in self._cache):
                        self.stats.rebinds += 1
                    return self._capture(key, sched, feeds, on_device, protect)
            if not warming:
                return self._replay_or_eager(key, entry, feeds, on_device, protect)
        return self._eager(feeds, on_device, protect)

    def _places(self, feeds: Sequence[Any], in_place: Collection[int]) -> tuple:
        """(position, data pointer, strides) of each device feed read in place: part of the
        key, so a graph is replayed only on the very buffers it was captured on. The same
        array objects as last run (a decode's bound caches) give last run's answer."""
        at = tuple(in_place)
        objs = [feeds[i] for i in at]
        last = self._last_places
        if last is not None and last[0] == at and all(map(operator.is_, last[1], objs)):
            return last[2]
        places = self._find_places(feeds, at)
        self._last_places = (at, objs, places)  # holds the arrays: their ids stay theirs
        return places

    def _find_places(self, feeds: Sequence[Any], in_place: Collection[int]) -> tuple:
        be = self._device()
        address = getattr(be, "address", None)
        if address is None:  # a backend that cannot say where an array is: copy every feed
            return ()
        out = []
        for i in sorted(set(in_place)):
            x = feeds[i]
            if be.is_device(x) and getattr(x, "size", 0):
                out.append((i, int(address(x)), tuple(x.strides)))
        return tuple(out)

    def _device(self) -> CaptureBackend:
        if self._backend is None:
            self._backend = self.config.backend()
        return self._backend

    def _replay_or_eager(
        self, key: tuple, entry: _Entry, feeds: Sequence[Any], on_device: bool, protect: bool
    ) -> list[Any]:
        self._cache.move_to_end(key)
        try:
            with self._contexts():
                outs = self._replay(entry, feeds, protect)
        except Invalidated as exc:
            self.stats.invalidations += 1
            self.stats.failures.append(f"invalidated: {exc}")
            del self._cache[key]
            self._warm.pop(key[:4], None)
            return self._eager(feeds, on_device, protect)
        self.stats.replays += 1
        return outs

    # -- capture ---------------------------------------------------------------
    def _capture(
        self, key: tuple, sched: _Schedule, feeds: Sequence[Any], on_device: bool, protect: bool
    ) -> list[Any]:
        be = self._device()
        plan = sched.plan
        entry = _Entry(sched, be.memory(), plan.template.copy())
        slots = plan.input_slots
        entry.bound = {slots[p[0]]: feeds[p[0]] for p in key[4]}
        try:
            with self._contexts():
                outs = self._first_run(entry, be, feeds, protect)
        except CaptureFailed as exc:
            step = plan.steps[exc.index]
            why = f"capture failed at {step.name!r} ({step.op_type}): {exc.reason}"
            self._forced[on_device][exc.index] = why
            self._schedules.pop(on_device, None)
            self._warm.pop(key[:4], None)
            self.stats.fallbacks += 1
            self.stats.failures.append(why)
            if not on_device:
                host = self._schedule(False).cplan
                self.stats.policy, self.stats.reason = host.mode, self._reason(host)
                self.stats.segments = len(host.segments)
            return self._eager(feeds, on_device, protect)
        self._cache[key] = entry
        while len(self._cache) > self.config.cache_size:
            self._cache.popitem(last=False)
            self.stats.invalidations += 1
        self.stats.captures += 1
        return outs

    def _first_run(self, entry: _Entry, be: CaptureBackend, feeds: Sequence[Any], protect: bool):
        sched, state = entry.schedule, entry.state
        plan = sched.plan
        for s, x in zip(plan.input_slots, feeds):
            state[s] = x
        with entry.memory.allocating():
            for i in sched.stages:
                step = plan.steps[i]
                src = step.inputs[0]
                if src in entry.bound:
                    state[step.outputs[0]] = entry.bound[src]  # read where the caller has it
                    continue
                (val,) = step.fn(state[src])
                state[step.outputs[0]] = be.fixed(val)
        with _donation(sched):
            self._capture_parts(entry, be, state, plan)
        entry.pinned = {s: state[s] for s in sched.graph_reads if be.is_device(state[s])}
        return self._outputs(entry, be, protect)

    def _capture_parts(self, entry: _Entry, be: CaptureBackend, state: list, plan: Plan) -> None:
        sched = entry.schedule
        for k, (kind, what) in enumerate(sched.parts):
            if kind == "eager":
                self._step(state, what, plan)
                continue
            steps = sched.segment_steps(what)
            inside = {s for i in steps for s in plan.steps[i].outputs}
            at = [steps[0]]

            def run(steps=steps, inside=inside, at=at) -> None:
                for i in steps:
                    at[0] = i
                    if i in sched.constants:
                        step = plan.steps[i]
                        value = be.constant(state[step.inputs[0]], entry.memory)
                        state[step.outputs[0]] = value
                        continue
                    self._step(state, i, plan, inside)

            try:
                with entry.memory.allocating():
                    graph = be.capture(run, state, sorted(inside))
            except Exception as exc:
                raise CaptureFailed(at[0], f"{type(exc).__name__}: {exc}") from exc
            entry.graphs[k] = graph
            be.launch(graph)

    @staticmethod
    def _step(state: list, i: int, plan: Plan, inside: set[int] | None = None) -> None:
        step = plan.steps[i]
        res = step.fn(*[state[s] for s in step.inputs])
        for s, x in zip(step.outputs, res):
            state[s] = x
        if inside is not None:
            # Only values made and last used inside one graph: its memory is the graph's own.
            for s in step.frees:
                if s in inside:
                    state[s] = None

    # -- replay ----------------------------------------------------------------
    def _replay(self, entry: _Entry, feeds: Sequence[Any], protect: bool) -> list[Any]:
        be = self._backend
        assert be is not None
        sched, state = entry.schedule, entry.state
        plan = sched.plan
        for s, x in zip(plan.input_slots, feeds):
            state[s] = x
        for i in sched.stages:
            step = plan.steps[i]
            if step.inputs[0] in entry.bound:
                continue  # the key holds its pointer: the graph reads this very buffer
            dst, src = state[step.outputs[0]], feeds[plan.input_slots.index(step.inputs[0])]
            if src is not dst:
                self._copy(be, dst, src, step.name)
        with _donation(sched):
            self._replay_parts(entry, be, state, plan)
        return self._outputs(entry, be, protect, replay=True)

    def _replay_parts(self, entry: _Entry, be: CaptureBackend, state: list, plan: Plan) -> None:
        for k, (kind, what) in enumerate(entry.schedule.parts):
            if kind == "graph":
                be.launch(entry.graphs[k])
                continue
            self._step(state, what, plan)
            for s in plan.steps[what].outputs:
                buf = entry.pinned.get(s)
                if buf is not None and state[s] is not buf:
                    self._copy(be, buf, state[s], plan.steps[what].name)
                    state[s] = buf

    def _copy(self, be: CaptureBackend, dst: Any, src: Any, name: str) -> None:
        got = tuple(getattr(src, "shape", ()))
        if tuple(dst.shape) != got or np.dtype(dst.dtype) != np.dtype(src.dtype):
            raise Invalidated(
                f"{name!r} gave {np.dtype(src.dtype)} {list(got)}, the graph was captured "
                f"with {np.dtype(dst.dtype)} {list(dst.shape)}"
            )
        be.copy_into(dst, src)
        self.stats.copies += 1

    def _outputs(
        self, entry: _Entry, be: CaptureBackend, protect: bool, replay: bool = False
    ) -> list[Any]:
        sched, state = entry.schedule, entry.state
        plan = sched.plan
        fresh = {s for i in sched.output_steps for s in plan.steps[i].outputs}
        outs = []
        for s in plan.output_slots:
            x = state[s]
            if s in fresh:
                outs.append(x)
            elif be.is_device(x):
                if protect:
                    x = be.duplicate(x)
                    self.stats.copies += replay
                outs.append(x)
            elif isinstance(x, np.ndarray):
                outs.append(x.copy())
            else:
                outs.append(x)
        return outs
