"""onnxruntime as an exact int8 reference on every x86 CPU.

On x86 CPUs without VNNI (AVX2, AVX-512 without VNNI), onnxruntime's MLAS multiplies a
uint8 activation by an int8 weight with ``vpmaddubsw``, which saturates each pair's sum at
int16: a MatMulInteger of 64 random values may be off by thousands (onnxruntime's own
session option ``session.x64quantprecision`` exists for it). Its uint8 x uint8 kernels are
exact there. ONNX defines the products exactly, and onnxep computes them exactly, so a test
that takes onnxruntime as the reference would fail on such a CPU for onnxruntime's error.

:func:`reference` gives the model and feeds onnxruntime should run instead: where
:func:`u8s8_exact` says the CPU's u8 x s8 product is inexact, every int8 weight of a
u8 x s8 product is shifted to uint8 (``w + 128``, its zero point ``+ 128``), which leaves
``w - zero_point`` and so every result unchanged, and takes onnxruntime's exact uint8 path.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: op -> (index of A, or None where A is float and quantised to uint8 inside; [(weight,
#: its zero point, its scale or None)...]) for the products with a uint8 x int8 kernel.
S8_WEIGHTS: dict[str, tuple[int | None, list[tuple[int, int, int | None]]]] = {
    "MatMulInteger": (0, [(1, 3, None)]),
    "ConvInteger": (0, [(1, 3, None)]),
    "QLinearMatMul": (0, [(3, 5, 4)]),
    "QLinearConv": (0, [(3, 5, 4)]),
    "QGemm": (0, [(3, 5, 4)]),
    "MatMulIntegerToFloat": (0, [(1, 5, 3)]),
    "QAttention": (0, [(1, 7, 4)]),
    "DynamicQuantizeMatMul": (None, [(1, 3, 2)]),
    "DynamicQuantizeLSTM": (None, [(1, 9, 8), (2, 11, 10)]),
}


@functools.cache
def u8s8_exact() -> bool:
    """Whether onnxruntime's uint8 x int8 MatMulInteger is exact on this CPU (a probe whose
    pair sums pass int16's range)."""
    import onnxruntime as ort

    a = np.full((1, 64), 255, np.uint8)
    b = np.full((64, 1), 127, np.int8)
    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    graph = helper.make_graph(
        [node],
        "probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])],
        [numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return int(sess.run(None, {"a": a})[0][0, 0]) == 255 * 127 * 64


def _types(model: onnx.ModelProto) -> dict[str, int]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - contrib ops: the declared types are enough
        inferred = model
    g = inferred.graph
    types = {i.name: i.data_type for i in g.initializer}
    for v in list(g.input) + list(g.value_info) + list(g.output):
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type:
            types.setdefault(v.name, v.type.tensor_type.elem_type)
    for n in g.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            types[n.output[0]] = n.attribute[0].t.data_type
    wanted = {
        i
        for n in model.graph.node
        if n.op_type in S8_WEIGHTS
        for i in n.input
        if i and i not in types
    }
    if wanted:  # outputs of contrib ops, which onnx's inference does not type: onnxruntime's
        types.update(_ort_types(model, wanted))
    return types


def _ort_types(model: onnx.ModelProto, names: set[str]) -> dict[str, int]:
    """The element types onnxruntime gives the tensors ``names`` (made graph outputs)."""
    import onnxruntime as ort

    probe = onnx.ModelProto.FromString(model.SerializeToString())
    have = {o.name for o in probe.graph.output}
    made = {o for n in probe.graph.node for o in n.output}
    for name in sorted(names & made - have):
        probe.graph.output.append(helper.make_empty_tensor_value_info(name))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        sess = ort.InferenceSession(
            probe.SerializeToString(), so, providers=["CPUExecutionProvider"]
        )
    except Exception:  # noqa: BLE001 - then the types stay unknown and nothing is shifted
        return {}
    by_name = {"tensor(uint8)": TensorProto.UINT8, "tensor(int8)": TensorProto.INT8}
    return {o.name: by_name[o.type] for o in sess.get_outputs() if o.type in by_name}


def reference(
    model: onnx.ModelProto, feeds: dict[str, np.ndarray]
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The model and feeds for onnxruntime to compute this model's exact results (see the
    module's note); the model itself where the CPU's u8 x s8 product is exact."""
    if u8s8_exact():
        return model, feeds
    types = _types(model)
    for name, value in feeds.items():
        types.setdefault(name, helper.np_dtype_to_tensor_dtype(np.asarray(value).dtype))
    model = onnx.ModelProto.FromString(model.SerializeToString())
    g = model.graph
    feeds = dict(feeds)
    inits = {i.name: i for i in g.initializer}
    inputs = {i.name: i for i in g.input}
    shifted: dict[str, str] = {}
    added: list[onnx.NodeProto] = []

    def to_u8(name: str) -> str:
        """``name`` + 128 as uint8, made once: in place for an initializer or a feed, by
        Cast/Add/Cast nodes for anything else."""
        if name in shifted:
            return shifted[name]
        new = name
        if name in inits:
            arr = numpy_helper.to_array(inits[name]).astype(np.int16) + 128
            inits[name].CopyFrom(numpy_helper.from_array(arr.astype(np.uint8), name))
        elif name in feeds and name in inputs:
            feeds[name] = (np.asarray(feeds[name]).astype(np.int16) + 128).astype(np.uint8)
            inputs[name].type.tensor_type.elem_type = TensorProto.UINT8
        else:
            new = f"{name}__u8"
            c128 = numpy_helper.from_array(np.array(128, np.int32), f"{name}__128")
            g.initializer.append(c128)
            added.extend(
                [
                    helper.make_node("Cast", [name], [f"{name}__i32"], to=TensorProto.INT32),
                    helper.make_node("Add", [f"{name}__i32", c128.name], [f"{name}__sum"]),
                    helper.make_node("Cast", [f"{name}__sum"], [new], to=TensorProto.UINT8),
                ]
            )
        shifted[name] = new
        return new

    def shift(node: onnx.NodeProto) -> None:
        """The node's int8 weights of a u8 x s8 product, and their zero points, as uint8."""
        spec = S8_WEIGHTS.get(node.op_type)
        if spec is None or node.domain not in ("", "ai.onnx", "com.microsoft"):
            return
        a_index, weights = spec
        if a_index is not None:
            a = node.input[a_index] if len(node.input) > a_index else ""
            if types.get(a) != TensorProto.UINT8:
                return
        for w, zp, scale in weights:
            if len(node.input) <= w or types.get(node.input[w]) != TensorProto.INT8:
                continue
            node.input[w] = to_u8(node.input[w])
            while len(node.input) <= zp:
                node.input.append("")
            if node.input[zp]:
                node.input[zp] = to_u8(node.input[zp])
            else:  # a zero point of 0 becomes 128, shaped like the scale where there is one
                shape: tuple[int, ...] = ()
                if scale is not None and node.input[scale] in inits:
                    shape = tuple(inits[node.input[scale]].dims)
                zname = f"{node.name or node.output[0]}__zp{w}"
                g.initializer.append(numpy_helper.from_array(np.full(shape, 128, np.uint8), zname))
                node.input[zp] = zname

    nodes = list(g.node)
    del g.node[:]
    for node in nodes:  # the graph is in order: a shift goes right before its first consumer
        shift(node)
        g.node.extend(added)
        added.clear()
        g.node.append(node)
    return model, feeds
