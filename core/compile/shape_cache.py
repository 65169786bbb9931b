"""Which values depend only on the shapes of a graph's inputs.

Exported models recompute shapes on every run (Shape, Gather, Concat, Range,
the causal mask, rotary tables from positions). Those values are a function
of the input shapes, so the executor computes them once per input-shape key
and reuses them. A value qualifies when it is produced from constants and
Shape/Size of tensors whose shapes themselves follow from the input shapes;
ops whose output shape depends on data (NonZero, Unique, control flow...)
break the chain.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx_ir as ir

from .partition import PlacedNode

# Output shape depends on input data that no kernel declares as a host input.
DATA_DEPENDENT = frozenset(
    {
        "NonZero",
        "Unique",
        "Compress",
        "NonMaxSuppression",
        "StringSplit",
        "TfIdfVectorizer",
        "Loop",
        "If",
        "Scan",
        "SequenceMap",
        "SplitToSequence",
        "ConcatFromSequence",
        "SequenceConstruct",
        "SequenceInsert",
        "SequenceErase",
        "SequenceAt",
        "SequenceEmpty",
        "SequenceLength",
        "Optional",
        "OptionalGetElement",
        "OptionalHasElement",
        "ImageDecoder",
    }
)
RANDOM = frozenset(
    {
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Bernoulli",
        "Multinomial",
        "Dropout",
    }
)


def _is_const(v: ir.Value) -> bool:
    return v.const_value is not None and not v.is_graph_input()


def shape_derived_nodes(
    placed: Sequence[PlacedNode],
    graph_outputs: Sequence[ir.Value],
    outer: Sequence[ir.Value] = (),
) -> set[int]:
    """``id(node)`` of every node whose outputs depend only on the input shapes.

    ``outer``: the enclosing scope's values a subgraph reads. Its plan takes them as
    inputs after its own, so their shapes are in the cache key as the inputs' are (silero
    VAD's LSTM branch tests the rank of an outer value on every run).
    """
    roots = {id(v) for v in outer}
    static: set[int] = set(roots)  # values whose shape follows from the input shapes
    derived: set[int] = set()  # values that follow from the input shapes
    outputs = {id(v) for v in graph_outputs}
    nodes: set[int] = set()
    for p in placed:
        n = p.node
        if n.op_type in DATA_DEPENDENT or n.op_type in RANDOM or p.implicit:
            continue
        if any(o is not None and id(o) in outputs for o in n.outputs):
            continue  # a caller may write into an output; a cached one must stay intact
        ins = [v for v in n.inputs if v is not None]

        def shape_known(v: ir.Value) -> bool:
            return _is_const(v) or v.is_graph_input() or id(v) in static

        host = p.claim.spec.host_inputs
        host_ok = all(
            v is None or i not in host or _is_const(v) or id(v) in derived
            for i, v in enumerate(n.inputs)
        )
        if all(shape_known(v) for v in ins) and host_ok:
            static.update(id(o) for o in n.outputs if o is not None)
        is_shape = n.domain in ("", "ai.onnx") and n.op_type in ("Shape", "Size")
        if (is_shape and ins and shape_known(ins[0])) or (
            not is_shape and ins and all(_is_const(v) or id(v) in derived for v in ins)
        ):
            derived.update(id(o) for o in n.outputs if o is not None)
            static.update(id(o) for o in n.outputs if o is not None)
            nodes.add(id(n))
    return nodes
