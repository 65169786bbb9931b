"""Small models shared by the CUDA tests."""

from __future__ import annotations

from onnx import TensorProto, helper


def unary_pair(shape=(3,), elem=TensorProto.FLOAT):
    """x -> (Relu(x) + 1, Neg(x)): two outputs, one constant."""
    one = helper.make_tensor("one", elem, [1], [1.0])
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Add", ["r", "one"], ["y"]),
        helper.make_node("Neg", ["x"], ["z"]),
    ]
    graph = helper.make_graph(
        nodes,
        "pair",
        [helper.make_tensor_value_info("x", elem, list(shape))],
        [
            helper.make_tensor_value_info("y", elem, list(shape)),
            helper.make_tensor_value_info("z", elem, list(shape)),
        ],
        [one],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def single(op, inputs, outputs, attrs=None, opset=17, inits=()):
    """One node; ``inputs``/``outputs`` are ``(name, elem_type, shape)``."""
    node = helper.make_node(
        op, [n for n, _, _ in inputs], [n for n, _, _ in outputs], **(attrs or {})
    )
    init_names = {t.name for t in inits}
    graph = helper.make_graph(
        [node],
        op,
        [helper.make_tensor_value_info(n, e, s) for n, e, s in inputs if n not in init_names],
        [helper.make_tensor_value_info(n, e, s) for n, e, s in outputs],
        list(inits),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


F32 = TensorProto.FLOAT
F16 = TensorProto.FLOAT16
I64 = TensorProto.INT64
BF16 = TensorProto.BFLOAT16
