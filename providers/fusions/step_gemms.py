"""Gemms of one weight, each on one time step of a sequence -> one Gemm over every step.

An RNN cell unrolled by a tracing exporter (torch's ``LSTMCell`` or ``GRUCell``
called in a Python loop) reads step ``t`` of the sequence with
``Gather(x, t, axis=0)`` and projects it with ``Gemm(x_t, W, b)``, the same
constant ``W`` and ``b`` at every step. Only the recurrent product depends on
the previous step, so the input projections can run up front as one GEMM over
``[T * batch, K]``: the weight is read once instead of ``T`` times, and BLAS
gets a product large enough to block. Each step's output becomes a Gather of
the joined result, a ``[batch, N]`` slab:

    Reshape(x, [-1, K]) -> Gemm(., W, b) -> Reshape(., [T, -1, N]) -> Gather(., t, axis=0)

Matched on structure only: ``x`` of rank 3 with static ``T`` and ``K``, a
scalar constant index, ``transA`` 0, a constant ``W`` and a bias that is absent
or one row (so every step adds the same one). The Gemms are grouped by ``x``,
``W``, bias and attributes; a group is joined when it has at least two members
and reads at least half of the ``T`` steps (a join over two steps of a long
sequence would compute steps nobody reads). The Gathers of ``x`` go when
nothing else reads them.

Tolerance-level: BLAS may block the larger product differently, so a sum's
order can change.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from . import rule_checks as C
from .graph_edits import new_initializer, take_over
from .naming import Names, graphs
from .reporting import SPANS_PROVIDERS, ReportingFusionPass, no_kernel

FEW_STEPS = "the Gemms read fewer than half of the sequence's steps"


def _int_attr(node: ir.Node, name: str, default: int) -> int:
    a = node.attributes.get(name)
    return default if a is None else int(a.value)


def _float_attr(node: ir.Node, name: str, default: float) -> float:
    a = node.attributes.get(name)
    return default if a is None else float(a.value)


def _step(gemm: ir.Node) -> tuple[ir.Node, ir.Value, int, int] | None:
    """(the Gather, the sequence, the step, T) when ``gemm`` projects one step of a
    rank-3 sequence with a constant weight and a one-row bias, else None."""
    if gemm.domain not in ("", "ai.onnx") or gemm.op_type != "Gemm" or len(gemm.inputs) < 2:
        return None
    a = gemm.inputs[0]
    gather = None if a is None else a.producer()
    if gather is None or gather.op_type != "Gather" or gather.domain not in ("", "ai.onnx"):
        return None
    if _int_attr(gather, "axis", 0) != 0 or _int_attr(gemm, "transA", 0) != 0:
        return None
    x = gather.inputs[0]
    idx = C.const(gather.inputs[1])
    if idx is None or idx.ndim != 0 or idx.dtype.kind not in "iu" or C.rank(x) != 3:
        return None
    t, k = C.dim(x, 0), C.dim(x, 2)
    if not isinstance(t, int) or not isinstance(k, int) or not -t <= int(idx) < t:
        return None
    w = C.const_shape(gemm.inputs[1])
    if w is None or len(w) != 2 or w[_int_attr(gemm, "transB", 0)] != k:
        return None
    if C.floats(x, gemm.inputs[1]) is not None:
        return None
    bias = gemm.inputs[2] if len(gemm.inputs) > 2 else None
    if bias is not None:
        shape = C.const_shape(bias)
        n = w[0] if _int_attr(gemm, "transB", 0) else w[1]
        if shape is None or shape not in ((), (1,), (n,), (1, n), (1, 1)):
            return None
    return gather, x, int(idx) % t, t


def _key(gemm: ir.Node, x: ir.Value) -> tuple[Any, ...]:
    bias = gemm.inputs[2] if len(gemm.inputs) > 2 else None
    return (
        id(x),
        id(gemm.inputs[1]),
        None if bias is None else id(bias),
        _int_attr(gemm, "transB", 0),
        _float_attr(gemm, "alpha", 1.0),
        _float_attr(gemm, "beta", 1.0),
        id(gemm.graph),
    )


class FuseStepGemms(ReportingFusionPass):
    """Per-step input projections of an unrolled RNN -> one Gemm. Tolerance-level (see
    module)."""

    name = "fuse_step_gemms"
    exact = False

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        names: Names | None = None
        changed = False
        for graph in list(graphs(model.graph)):
            groups: dict[tuple[Any, ...], list[tuple[ir.Node, ir.Node, int, int]]] = {}
            for node in graph:
                step = _step(node)
                if step is None:
                    continue
                gather, x, t, steps = step
                groups.setdefault(_key(node, x), []).append((node, gather, t, steps))
            for members in groups.values():
                if len(members) < 2:
                    continue
                anchor = members[0][0]
                if not all(self.owns(g) and self.owns(s) for g, s, _, _ in members):
                    if any(self.owns(g) for g, _, _, _ in members):
                        self.refuse(anchor, SPANS_PROVIDERS)
                    continue
                if 2 * len({t for _, _, t, _ in members}) < members[0][3]:
                    self.refuse(anchor, FEW_STEPS)
                    continue
                missing = [op for op in ("Reshape", "Gemm", "Gather") if not self.can_emit("", op)]
                if missing:
                    self.refuse(anchor, no_kernel("", missing[0]))
                    continue
                names = names or Names(model.graph)
                self._join(graph, members, names)
                self.fire(anchor, "joined_steps")
                changed = True
        return ir.passes.PassResult(model, changed)

    def _join(
        self, graph: ir.Graph, members: list[tuple[ir.Node, ir.Node, int, int]], names: Names
    ) -> None:
        order = {id(n): i for i, n in enumerate(graph)}
        members = sorted(members, key=lambda m: order[id(m[1])])
        first_gemm, first_gather, _, steps = members[0]
        x = first_gather.inputs[0]
        w = C.const_shape(first_gemm.inputs[1])
        trans_b = _int_attr(first_gemm, "transB", 0)
        k, n = (w[1], w[0]) if trans_b else (w[0], w[1])
        stem = first_gemm.name or "Gemm"
        flat_shape = new_initializer(
            graph, names.fresh(f"{stem}/steps_shape"), np.array([-1, k], np.int64)
        )
        out_shape = new_initializer(
            graph, names.fresh(f"{stem}/steps_out_shape"), np.array([steps, -1, n], np.int64)
        )
        flat = ir.node("Reshape", [x, flat_shape], name=names.fresh(f"{stem}/steps_flat"))
        inputs = [flat.outputs[0], *first_gemm.inputs[1:]]
        attrs = {
            "alpha": _float_attr(first_gemm, "alpha", 1.0),
            "beta": _float_attr(first_gemm, "beta", 1.0),
            "transB": trans_b,
        }
        joined = ir.node("Gemm", inputs, attrs, name=names.fresh(f"{stem}/steps"))
        split = ir.node(
            "Reshape", [joined.outputs[0], out_shape], name=names.fresh(f"{stem}/steps_split")
        )
        batch = x.shape[1] if x.shape is not None else None
        for node, shape in (
            (flat, [None, k]),
            (joined, [None, n]),
            (split, [steps, batch, n]),
        ):
            out = node.outputs[0]
            out.name = names.fresh(f"{node.name}_out")
            out.type = first_gemm.outputs[0].type
            out.shape = ir.Shape(shape)
        graph.insert_before(first_gather, [flat, joined, split])
        for gemm, gather, _, _ in members:
            step = ir.node(
                "Gather",
                [split.outputs[0], gather.inputs[1]],
                {"axis": 0},
                name=names.fresh(f"{gemm.name or 'Gemm'}/step"),
            )
            take_over(gemm.outputs[0], step.outputs[0])
            graph.insert_before(gemm, [step])
            graph.remove(gemm, safe=True)
            if not gather.outputs[0].uses() and not gather.outputs[0].is_graph_output():
                graph.remove(gather, safe=True)
