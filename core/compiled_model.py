"""CompiledModel: one model compiled for a session's providers, and how it runs.

The one object the session, IO binding and the decoder hold: the graph after
rewrites, the plan of its main graph (and subgraphs), the feed checks, which
graph inputs a kernel may update in place, which a host step reads, and the
run, eager or through captured graphs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from onnxep.providers import CaptureConfig
from onnxep.providers.inplace import any_donated, donating

from .capture.runner import CapturedRunner, graph_id_of
from .compile.plan import Plan
from .compiled_graph import CompileContext, CompiledGraph, compile_graph
from .errors import InvalidArgument
from .execute.executor import Executor
from .execute.profiling import Profiler
from .model_io import FeedCheck

__all__ = ["CompiledModel"]


class CompiledModel:
    """``model`` (an onnx-ir model, rewritten) compiled with ``ctx``; ``capture``, asked once
    the plan stands, says how a device provider captures it (None: no capture)."""

    def __init__(
        self,
        model: Any,
        ctx: CompileContext,
        capture: Callable[[], CaptureConfig | None] | None = None,
        profiler: Profiler | None = None,
    ) -> None:
        self.model = model
        self.context = ctx
        self.profiler = profiler
        graph = model.graph
        self.main: CompiledGraph = compile_graph(graph, ctx)
        inits = {id(v) for v in graph.initializers.values()}
        #: the graph inputs a caller feeds, and the initializers a feed may override
        self.inputs = [v for v in graph.inputs if id(v) not in inits]
        self.overridable = [v for v in graph.inputs if id(v) in inits]
        #: every graph input's name, in the order the plan takes its feeds
        self.input_names = [v.name or "" for v in graph.inputs]
        self.output_names = [v.name or "" for v in graph.outputs]
        self._checks = {v.name: FeedCheck(v) for v in graph.inputs}
        self._defaults = {v.name: v.const_value.numpy() for v in self.overridable}
        #: the feeds' names when exactly the fed inputs are given (the usual call), and
        #: per graph input its check, or its initializer's value when not fed
        self._fed_names = frozenset(v.name for v in self.inputs)
        self._exact = [
            (name, self._checks[name], name in self._defaults) for name in self.input_names
        ]
        self._output_index = {n: i for i, n in enumerate(self.output_names)}
        #: graph inputs a kernel may update in place: input name -> (node name, output name)
        self.inplace = self._inplace_pairs()
        self._host_read: set[str] | None = None
        self.capture: CapturedRunner | None = None
        config = capture() if capture is not None else None
        if config is not None:
            ex = self.executor
            self.capture = CapturedRunner(self.plan, config, self._eager, ex.enter_contexts)

    @property
    def plan(self) -> Plan:
        return self.main.plan

    @property
    def executor(self) -> Executor:
        return self.main.executor

    @property
    def graphs(self) -> list[CompiledGraph]:
        """The main graph and every subgraph (If branches, Loop and Scan bodies)."""
        return [self.main, *self.context.subgraphs]

    # -- running ---------------------------------------------------------------------------
    def run(
        self,
        input_feed: Mapping[str, Any],
        output_names: Sequence[str] | None = None,
        *,
        on_device: bool = False,
        run_options: Any = None,
    ) -> list[Any]:
        """Run on named feeds; ``output_names`` None or empty is every output, in model
        order. ``on_device`` leaves each output in its producing provider's memory."""
        feeds = self.feeds(input_feed)
        pick = self.pick(output_names)
        if on_device:
            outs = self.run_on_device(feeds, run_options=run_options)
        elif self.capture is not None and self.profiler is None:
            outs = self.capture.run(feeds, graph_id_of(run_options))
        elif self.profiler is None:
            outs = self.main.run(feeds)
            if not output_names:
                return outs  # a new list every run, in model order
        else:
            t0 = self.profiler.now_us()
            outs = self.main.run(feeds)
            self.profiler.record("model_run", "Session", t0, self.profiler.now_us() - t0)
        return [outs[i] for i in pick]

    def run_on_device(
        self,
        inputs: list[Any],
        *,
        run_options: Any = None,
        protect: bool = True,
        in_place: Sequence[int] = (),
        donated: Mapping[str, int | tuple[int, ...]] | None = None,
    ) -> list[Any]:
        """The plan run on checked feeds (see ``feeds``), left on the device, through
        captured graphs when a policy applies; ``protect=False`` is IO binding's sharing path (see
        ``Executor.run_on_device``), ``in_place`` its shared buffers, which graphs read where
        they are, and ``donated`` those a node may overwrite (node name -> address or addresses;
        ``onnxep.providers.inplace``)."""
        if not donated and not any_donated():
            # nothing given up here or around: no context to set (1.2 us of a decode step)
            return self._on_device(inputs, run_options, protect, in_place)
        with donating(donated or {}):
            return self._on_device(inputs, run_options, protect, in_place)

    def _on_device(
        self, inputs: list[Any], run_options: Any, protect: bool, in_place: Sequence[int]
    ) -> list[Any]:
        if self.capture is not None and self.profiler is None:
            gid = graph_id_of(run_options)
            return self.capture.run(inputs, gid, True, protect, in_place)
        return self.executor.run_on_device(inputs, protect_feeds=protect)

    def _eager(self, feeds: list[Any], on_device: bool, protect: bool) -> list[Any]:
        ex = self.executor
        return ex.run_on_device(feeds, protect_feeds=protect) if on_device else ex.run(feeds)

    # -- feeds and outputs -----------------------------------------------------------------
    def feed_check(self, name: str) -> FeedCheck:
        """The check that graph input ``name``'s feeds go through on every run."""
        check = self._checks.get(name)
        if check is None:
            raise InvalidArgument(
                f"unknown input {name!r}; the model's inputs are "
                f"{', '.join(repr(n) for n in self.input_names)}"
            )
        return check

    def feeds(self, input_feed: Mapping[str, Any]) -> list[Any]:
        """The plan's feeds from named ones: each checked, overridable initializers filled."""
        if input_feed.__class__ is dict and input_feed.keys() == self._fed_names:
            # Every input fed, nothing else: no names to look for or report.
            defaults = self._defaults
            return [
                defaults[name] if default else check(input_feed[name])
                for name, check, default in self._exact
            ]
        if not isinstance(input_feed, Mapping):
            raise InvalidArgument(
                f"input_feed must be a dict of input name to array, got {type(input_feed).__name__}"
            )
        extra = [k for k in input_feed if k not in self._checks]
        if extra:
            expected = ", ".join(repr(v.name) for v in self.inputs)
            raise InvalidArgument(
                f"unknown input(s) {', '.join(map(repr, extra))}; the model's inputs are {expected}"
            )
        feeds: list[Any] = []
        for name in self.input_names:
            if name in input_feed:
                feeds.append(self._checks[name](input_feed[name]))
            elif name in self._defaults:
                feeds.append(self._defaults[name])
            else:
                raise InvalidArgument(
                    f"missing input {name!r} ({self._checks[name].arg.type}, shape "
                    f"{self._checks[name].arg.shape}); every model input must be fed"
                )
        return feeds

    def pick(self, output_names: Sequence[str] | None) -> list[int]:
        """The indices of ``output_names`` among the model's outputs (None or [] is all)."""
        if isinstance(output_names, str):
            raise InvalidArgument("output_names must be a list of names or None, not a string")
        if not output_names:  # None or [] mean every output, as in onnxruntime
            return list(range(len(self.output_names)))
        out = []
        for n in output_names:
            if n not in self._output_index:
                raise InvalidArgument(
                    f"unknown output {n!r}; the model's outputs are "
                    f"{', '.join(map(repr, self.output_names))}"
                )
            out.append(self._output_index[n])
        return out

    # -- what the plan says about its inputs -------------------------------------------------
    def _inplace_pairs(self) -> dict[str, tuple[str, str]]:
        """Graph inputs a kernel may update in place (``KernelSpec.inplace``) when a caller
        binds one buffer as that input and as the paired graph output: input name ->
        (node name, output name). Only where the node is the input's one reader and its
        output is the graph output itself (see ``onnxep.providers.inplace``)."""
        pairs: dict[str, tuple[str, str]] = {}
        graph = self.model.graph
        for p in self.main.placed:
            node = p.node
            for i, o in p.claim.spec.inplace:
                if i >= len(node.inputs) or o >= len(node.outputs) or node.inputs[i] is None:
                    continue
                x, y = node.inputs[i], node.outputs[o]
                readers = {id(u.node) for u in x.uses()}
                if (
                    x.is_graph_input()
                    and not x.is_graph_output()
                    and readers == {id(node)}
                    and sum(v is y for v in graph.outputs) == 1
                    and x.name
                    and y.name
                ):
                    pairs[x.name] = (p.name, y.name)
        return pairs

    def host_read_inputs(self) -> set[str]:
        """Graph inputs that some host-side step of the plan reads directly."""
        if self._host_read is None:
            plan = self.plan
            device = {p.name: p.device for p in self.context.providers}
            slot_name = {s: n for s, n in zip(plan.input_slots, self.input_names)}
            read: set[str] = set()
            for step in plan.steps:
                if step.kind == "kernel" and device.get(step.provider) == "cpu":
                    read.update(slot_name[s] for s in step.inputs if s in slot_name)
            self._host_read = read
        return self._host_read

    def output_nodes(self) -> dict[str, tuple[str, ...]]:
        """Each graph output's ancestry: the placed nodes of the main graph it depends on."""
        name_of = {id(p.node): p.name for p in self.main.placed}
        out: dict[str, tuple[str, ...]] = {}
        for value in self.model.graph.outputs:
            seen: set[int] = set()
            stack = [value.producer()]
            while stack:
                node = stack.pop()
                if node is None or id(node) in seen:
                    continue
                seen.add(id(node))
                stack += [v.producer() for v in node.inputs if v is not None]
            out[value.name or ""] = tuple(name_of[i] for i in seen if i in name_of)
        return out
