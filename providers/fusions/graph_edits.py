"""Edits the weight-rewriting fusions share: new constant weights, outputs taken over, and
weights dropped once nothing reads them."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import onnx_ir as ir


def new_initializer(graph: ir.Graph, name: str, arr: np.ndarray) -> ir.Value:
    """``arr`` (made C-contiguous) as initializer ``name`` of ``graph``."""
    arr = np.ascontiguousarray(arr)
    v = ir.Value(name=name, const_value=ir.tensor(arr, name=name))
    v.type = ir.TensorType(ir.DataType.from_numpy(arr.dtype))
    v.shape = ir.Shape(arr.shape)
    graph.register_initializer(v)
    return v


def take_over(old: ir.Value, new: ir.Value) -> None:
    """``new`` replaces ``old`` everywhere, graph outputs included, under its name."""
    new.type, new.shape = old.type, old.shape
    name = old.name
    old.replace_all_uses_with(new, replace_graph_outputs=True)
    old.name = None
    new.name = name


def drop_unread_initializers(values: Iterable[ir.Value | None]) -> None:
    """Remove each of ``values`` that is an initializer nothing reads any more from the graph
    that holds it (a graph input or output stays)."""
    for v in values:
        if v is None or v.uses() or v.is_graph_input() or v.is_graph_output():
            continue
        graph = v.graph if v.is_initializer() else None
        if graph is not None and graph.initializers.get(v.name) is v:
            del graph.initializers[v.name]
