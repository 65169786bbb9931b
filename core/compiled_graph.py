"""One graph, from IR to an executor: partition, host shape math, copies, plan.

Subgraphs (If branches, Loop and Scan bodies) go through the same function,
with the enclosing scope's values they read bound as extra inputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx_ir as ir

from onnxep.providers.provider import Provider

from .compile.islands import move_small_islands_to_host
from .compile.nodeinfo import const_of
from .compile.partition import PlacedNode, check_fallback, move_shape_math_to_host, partition
from .compile.plan import Plan, PlanBuilder
from .compile.shape_cache import shape_derived_nodes
from .execute.executor import Executor, RunContext
from .execute.profiling import Profiler


def _syncs(providers: Sequence[Provider]) -> dict:
    return {p.name: p.synchronize for p in providers if p.device != "cpu"}


def _run_contexts(providers: Sequence[Provider]) -> tuple[RunContext, ...]:
    """The providers that override ``run_context`` (on the class, or on the instance when an
    option asks for one); a session without any pays nothing per run."""
    return tuple((p.name, p.run_context) for p in providers if p.implements("run_context"))


class ConstCache:
    """Each constant converted to NumPy once, shared by kernels and the plan.

    An initializer that is also a graph input can be overridden by a feed,
    so it is not a constant.
    """

    def __init__(self) -> None:
        self._cache: dict[int, Any] = {}

    def __call__(self, value: ir.Value) -> Any:
        key = id(value)
        if key in self._cache:
            return self._cache[key]
        arr = None if value.is_graph_input() else const_of(value)
        if arr is not None and not arr.flags.c_contiguous:
            arr = arr.copy(order="C")
        self._cache[key] = arr
        return arr


@dataclass
class CompileContext:
    providers: Sequence[Provider]
    opsets: dict[str, int]
    host: Provider | None
    disable_fallback: bool = False
    const: ConstCache = field(default_factory=ConstCache)
    subgraphs: list[CompiledGraph] = field(default_factory=list)
    profiler: Profiler | None = None
    shape_cache: bool = True
    #: device islands of fewer nodes than this move to the host (0: none; the candidate
    #: ``placement="measured"`` times, see compile/islands.py)
    island_nodes: int = 0


@dataclass
class CompiledGraph:
    name: str
    placed: list[PlacedNode]
    plan: Plan
    executor: Executor
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    moved_to_host: int = 0
    #: for a subgraph that only hands values on (see ``forwarded_feeds``): each output's
    #: position among the run's feeds; None otherwise
    forwards: tuple[int, ...] | None = None

    def run(self, inputs: Sequence[Any], outer: Sequence[Any] = ()) -> list[Any]:
        feeds = [*inputs, *outer] if outer else inputs
        if self.forwards is not None:
            return [feeds[i] for i in self.forwards]
        return self.executor.run(feeds)

    def run_on_device(self, inputs: Sequence[Any]) -> list[Any]:
        """Run, leaving each output in the memory of the provider that produced it."""
        return self.executor.run_on_device(list(inputs))


def compile_graph(
    graph: ir.Graph,
    ctx: CompileContext,
    outer: Sequence[ir.Value] = (),
    prefix: str = "",
) -> CompiledGraph:
    def compile_sub(sub: ir.Graph, implicit: list[ir.Value]) -> CompiledGraph:
        label = f"{prefix}{sub.name or 'subgraph'}/"
        compiled = compile_graph(sub, ctx, implicit, label)
        ctx.subgraphs.append(compiled)
        return compiled

    placed = partition(graph, ctx.providers, ctx.opsets, compile_sub, ctx.const, prefix)
    moved = move_shape_math_to_host(placed, ctx.host, graph.outputs)
    if ctx.island_nodes:
        move_small_islands_to_host(placed, ctx.host, ctx.island_nodes)
    if ctx.disable_fallback and ctx.providers:
        check_fallback(placed, ctx.providers[0])
    builder = PlanBuilder(ctx.providers, ctx.const)
    if ctx.shape_cache:
        builder.shape_nodes = shape_derived_nodes(placed, graph.outputs, outer)
    input_slots = [builder.bind_input(v) for v in graph.inputs]
    input_slots += [builder.bind_input(v) for v in outer]
    for p in placed:
        builder.add_node(p)
    plan = builder.finish(input_slots, graph.outputs)
    # A subgraph runs inside its parent's run, whose contexts are already entered
    # and whose output rules cover the parent's values the subgraph returns.
    top_level = not prefix
    forwards = None if top_level or ctx.profiler is not None else forwarded_feeds(plan)
    executor = Executor(
        plan,
        ctx.profiler,
        _syncs(ctx.providers) if ctx.profiler else None,
        contexts=_run_contexts(ctx.providers) if top_level else (),
        protect_feeds=top_level,
    )
    return CompiledGraph(
        name=graph.name or prefix,
        placed=placed,
        plan=plan,
        executor=executor,
        input_names=tuple(v.name or "" for v in graph.inputs),
        output_names=tuple(v.name or "" for v in graph.outputs),
        moved_to_host=moved,
        forwards=forwards,
    )


#: the generic Identity kernel's label (``plan.kernel_label``): it returns its input itself
_IDENTITY = "onnxep.providers.ops.op_identity.identity"


def forwarded_feeds(plan: Plan) -> tuple[int, ...] | None:
    """Each output's feed position when the plan is host Identity steps only, else None.

    Exporters write If branches that return outer values through Identity (silero VAD's
    LSTM branch runs three such Ifs a run); the generic Identity kernel returns its input
    itself, and a subgraph's outputs are handed over as they are (its parent guards the
    feeds), so such a branch is its feeds in another order, without an executor call.
    """
    source = {slot: i for i, slot in enumerate(plan.input_slots)}
    for step in plan.steps:
        if step.op_type != "Identity" or not step.kernel.startswith(_IDENTITY):
            return None
        if len(step.inputs) != 1 or len(step.outputs) != 1 or step.inputs[0] not in source:
            return None
        source[step.outputs[0]] = source[step.inputs[0]]
    # An output listed twice is copied by the executor's rules (aliasing: the caller may
    # write into one and not the other), so such a branch keeps its executor.
    outs = plan.output_slots
    if len(set(outs)) != len(outs) or any(s not in source for s in outs):
        return None
    return tuple(source[s] for s in plan.output_slots)
