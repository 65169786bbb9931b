"""What onnxruntime loads and runs, onnxep runs too: read in a normal form, with a load note.

Each case is a minimal model that a load-time check once refused although
onnxruntime runs it: a negative declared dim (Paddle2ONNX writes -1 for a
dynamic one), text that is not UTF-8, a value_info entry with a type outside
ONNX's, a node of a domain the model does not import, an external_data key
given twice. Each runs on onnxep's CPU provider and on onnxruntime with the
same feeds, the outputs are compared, and the placement report's load notes
must say what was read differently. The refusals onnxep keeps are listed
last: for each, onnxruntime refuses the same model too, when it loads it.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from conftest import make_model, save, tensor
from onnx import AttributeProto, TensorProto, helper, numpy_helper

import onnxep
from onnxep.errors import OnnxepError

ort = pytest.importorskip("onnxruntime")

X = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)


def ort_session(model):
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the refusals below are expected; keep the log quiet
    data = model if isinstance(model, (bytes, str)) else model.SerializeToString()
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def both(model, feeds):
    """Run ``model`` on onnxep (CPU) and onnxruntime; assert equal outputs; the load notes."""
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    got = sess.run(None, feeds)
    want = ort_session(model).run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    return sess.placement().load_notes


def relu_neg(shape_x, shape_y):
    return make_model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])],
        [tensor("x", shape_x)],
        [tensor("y", shape_y)],
    )


# -- negative dims ---------------------------------------------------------------------


def test_negative_input_dim_is_an_unknown_dim_fed_at_any_size():
    m = relu_neg([-1, 3], [-1, 3])
    for batch in (1, 2, 5):
        notes = both(m, {"x": np.resize(X, (batch, 3))})
    assert len(notes) == 1
    assert "2 value(s) declare negative dims, read as unknown dims" in notes[0]
    assert "'x' in graph 'g': -1 at axis 0" in notes[0]
    arg = onnxep.InferenceSession(m, providers=["cpu"]).get_inputs()[0]
    assert arg.shape == [None, 3] == ort_session(m).get_inputs()[0].shape


def test_negative_dim_before_slice_does_not_reach_shape_inference():
    # onnx's Slice shape inference aborts the whole process on a declared negative dim.
    starts = numpy_helper.from_array(np.array([0], np.int64), "starts")
    ends = numpy_helper.from_array(np.array([1], np.int64), "ends")
    m = make_model(
        [helper.make_node("Slice", ["x", "starts", "ends"], ["y"])],
        [tensor("x", [2, -5])],
        [tensor("y", None)],
        inits=[starts, ends],
    )
    assert "-5 at axis 1" in both(m, {"x": X})[0]


def test_negative_dims_in_value_info_outputs_and_subgraphs_are_unknown_dims():
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [], [])
    then.output.append(tensor("t", [-1, 3]))
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [])
    other.output.append(tensor("e", [-1, -3]))
    cond = numpy_helper.from_array(np.array(True), "c")
    m = make_model(
        [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
        [tensor("x", [2, 3])],
        [tensor("y", [-1, 3])],
        inits=[cond],
    )
    m.graph.value_info.append(tensor("unused", [-7]))
    (note,) = both(m, {"x": X})
    assert note.startswith("4 value(s) declare negative dims")
    assert "'e' in graph 'g' > If '' 'else_branch': -1 at axis 0, -3 at axis 1" in note


def test_negative_dim_through_shape_arithmetic():
    s0 = numpy_helper.from_array(np.array([0], np.int64), "s0")
    s1 = numpy_helper.from_array(np.array([1], np.int64), "s1")
    rest = numpy_helper.from_array(np.array([-1], np.int64), "rest")
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "s0", "s1"], ["batch"]),
        helper.make_node("Concat", ["batch", "rest"], ["new"], axis=0),
        helper.make_node("Reshape", ["x", "new"], ["y"]),
    ]
    m = make_model(nodes, [tensor("x", [-1, 3])], [tensor("y", None)], inits=[s0, s1, rest])
    both(m, {"x": X})


# -- text that is not UTF-8 ------------------------------------------------------------


def test_node_names_and_doc_strings_that_are_not_utf8_are_read_with_escapes():
    m = relu_neg([2, 3], [2, 3])
    m.graph.node[0].name = "relu"
    m.doc_string = "DOCSTRING"
    data = m.SerializeToString().replace(b"relu", b"r\xffl\xfe").replace(b"DOC", b"D\xfdC")
    (note,) = both(data, {"x": X})
    assert "2 text field(s) are not valid UTF-8" in note
    assert r"model.graph.node[0].name as 'r\\xffl\\xfe'" in note
    sess = onnxep.InferenceSession(data, providers=["cpu"])
    assert sess.placement().nodes[0].node == r"r\xffl\xfe"


def test_value_names_that_are_not_utf8_keep_the_graph_wired():
    # "r" (the Relu's output, read by Neg) becomes b"\xff" in both places.
    data = relu_neg([2, 3], [2, 3]).SerializeToString()
    data = data.replace(b"\x12\x01r", b"\x12\x01\xff").replace(b"\n\x01r", b"\n\x01\xff")
    assert onnx.load_from_string(data).graph.node[1].input[0] == b"\xff"
    (note,) = both(data, {"x": X})
    assert "graph.node[0].output[0]" in note and "graph.node[1].input[0]" in note


def test_escaped_name_that_clashes_with_a_real_name_is_refused():
    # b"\xff" read with escapes is the text "\\xff", which another value already has.
    m = make_model(
        [
            helper.make_node("Relu", ["x"], ["R"]),
            helper.make_node("Neg", ["x"], [r"\xff"]),
            helper.make_node("Add", ["R", r"\xff"], ["y"]),
        ],
        [tensor("x", [2, 3])],
        [tensor("y", [2, 3])],
    )
    data = m.SerializeToString().replace(b"\x12\x01R", b"\x12\x01\xff")
    with pytest.raises(OnnxepError, match=r"would be '\\\\xff', a name the model already uses"):
        onnxep.InferenceSession(data, providers=["cpu"])


# -- value_info entries, domains, external data ----------------------------------------


def test_value_info_with_a_type_outside_onnx_for_no_computed_value_is_dropped():
    m = relu_neg([2, 3], [2, 3])
    twin = tensor("y", [2, 3])  # the graph output's twin
    twin.type.tensor_type.elem_type = 99
    m.graph.value_info.append(twin)
    mapped = m.graph.value_info.add(name="unused")
    mapped.type.map_type.key_type = 99
    (note,) = both(m, {"x": X})
    assert note.startswith("2 value_info entries for no computed value declare a type")
    assert "'y' in graph 'g' declares element type 99" in note


@pytest.mark.parametrize(
    "node, inits, label",
    [
        (
            helper.make_node("FusedMatMul", ["x", "w"], ["y"], domain="com.microsoft", alpha=2.0),
            [numpy_helper.from_array(np.ones((3, 2), np.float32), "w")],
            "'com.microsoft'",
        ),
        (
            helper.make_node("Binarizer", ["x"], ["y"], domain="ai.onnx.ml", threshold=0.5),
            [],
            "'ai.onnx.ml'",
        ),
    ],
)
def test_domain_used_but_not_imported_is_read_at_its_newest_opset(node, inits, label):
    m = make_model([node], [tensor("x", [2, 3])], [tensor("y", None)], inits=inits)
    (note,) = both(m, {"x": X})
    assert f"1 node(s) ({node.op_type}) use {label}, which the model does not import" in note


def test_default_domain_not_imported_is_read_at_the_newest_onnx_opset():
    m = relu_neg([2, 3], [2, 3])
    m.opset_import[0].CopyFrom(helper.make_opsetid("ai.onnx.ml", 3))
    (note,) = both(m, {"x": X})
    newest = onnx.defs.onnx_opset_version()
    assert "(Neg, Relu) use the default ONNX domain (''), which" in note
    assert f"read at its opset {newest}" in note


def test_unknown_domain_not_imported_is_refused_as_onnxruntime_refuses_it():
    node = helper.make_node("Relu", ["x"], ["y"], domain="my.ops")
    m = make_model([node], [tensor("x", [2, 3])], [tensor("y", [2, 3])])
    with pytest.raises(OnnxepError, match="uses domain 'my.ops', which the model does not"):
        onnxep.InferenceSession(m, providers=["cpu"])
    with pytest.raises(Exception, match="No opset import for domain 'my.ops'"):
        ort_session(m)


def test_external_data_key_given_twice_reads_the_last(tmp_path):
    (tmp_path / "w.bin").write_bytes(np.arange(7, dtype=np.float32).tobytes())
    w = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[2, 3])
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "w.bin"), ("offset", "0"), ("offset", "4")):
        w.external_data.add(key=key, value=value)
    m = make_model(
        [helper.make_node("Add", ["x", "W"], ["y"])],
        [tensor("x", [2, 3])],
        [tensor("y", [2, 3])],
        inits=[w],
    )
    path = str(save(m, tmp_path / "m.onnx"))
    (note,) = both(path, {"x": X})
    assert "gives external_data key 'offset' twice ('0', '4'); the last is read" in note


def test_load_notes_are_in_explain_and_its_json(tmp_path, capsys):
    from onnxep.cli import main

    path = str(save(relu_neg([-1, 3], [-1, 3]), tmp_path / "m.onnx"))
    assert main(["explain", path, "--providers", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "load notes:\n  - 2 value(s) declare negative dims" in out
    assert main(["explain", path, "--providers", "cpu", "--json"]) == 0
    import json

    notes = json.loads(capsys.readouterr().out)["load_notes"]
    assert len(notes) == 1 and "-1 at axis 0" in notes[0]


def test_a_model_onnx_would_accept_as_it_is_has_no_load_notes():
    assert both(relu_neg([2, 3], [2, 3]), {"x": X}) == []


# -- the refusals onnxep keeps: onnxruntime refuses each too -----------------------------


def _attr(kind, **fields):
    node = helper.make_node("Softmax", ["x"], ["y"], axis=1)
    node.attribute[0].type = kind
    for name, value in fields.items():
        setattr(node.attribute[0], name, value)
    return make_model([node], [tensor("x", [2, 3])], [tensor("y", [2, 3])])


def _weight(fill):
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2, 3])
    fill(w)
    return make_model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        [tensor("x", [2, 3])],
        [tensor("y", [2, 3])],
        inits=[w],
    )


def _one(op, inputs, outputs, opset=17, **attrs):
    return make_model(
        [helper.make_node(op, inputs, outputs, **attrs)],
        [tensor("x", [2, 3])],
        [tensor(outputs[0], None)],
        opset=opset,
    )


def _input_elem_99():
    m = relu_neg([2, 3], [2, 3])
    m.graph.input[0].type.tensor_type.elem_type = 99
    return m


def _value_info_elem_99():
    m = relu_neg([2, 3], [2, 3])
    m.graph.value_info.append(tensor("r", [2, 3]))
    m.graph.value_info[0].type.tensor_type.elem_type = 99
    return m


def _no_opsets():
    m = relu_neg([2, 3], [2, 3])
    del m.opset_import[:]
    return m


def _ir_too_new():
    m = relu_neg([2, 3], [2, 3])
    m.ir_version = onnx.IR_VERSION + 1
    return m


def _opset(version):
    m = relu_neg([2, 3], [2, 3])
    m.opset_import[0].version = version
    return m


def _two_nodes(first, second, outputs=("y",)):
    return make_model(
        [helper.make_node(*first), helper.make_node(*second)],
        [tensor("x", [2, 3])],
        [tensor(o, [2, 3]) for o in outputs],
    )


def _pad_mode_not_utf8():
    pads = numpy_helper.from_array(np.zeros(4, np.int64), "p")
    node = helper.make_node("Pad", ["x", "p"], ["y"], mode="constant")
    m = make_model([node], [tensor("x", [2, 3])], [tensor("y", [2, 3])], inits=[pads])
    return m.SerializeToString().replace(b"constant", b"con\xffstan")


def _negative_tensor_dims(t):
    t.dims.extend([-2, 3])
    t.float_data.extend([1.0] * 6)


REFUSED = {
    "input element type 99": (_input_elem_99, "declares element type 99"),
    "element type 99 for a computed value": (_value_info_elem_99, "'r' declares element type 99"),
    "attribute type UNDEFINED": (
        lambda: _attr(AttributeProto.UNDEFINED),
        "attribute 'axis' has no valid type",
    ),
    "attribute type and field disagree": (
        lambda: _attr(AttributeProto.FLOAT),
        "is FLOAT but sets the INT field 'i'",
    ),
    "attribute with two value fields": (
        lambda: _attr(AttributeProto.INT, f=2.0),
        "sets several value fields",
    ),
    "input declared twice": (
        lambda: make_model(
            [helper.make_node("Relu", ["x"], ["y"])],
            [tensor("x", [2, 3]), tensor("x", [2, 3])],
            [tensor("y", [2, 3])],
        ),
        "input 'x' is declared twice",
    ),
    "value assigned twice": (
        lambda: _two_nodes(("Relu", ["x"], ["y"]), ("Neg", ["x"], ["y"])),
        "value 'y' is assigned twice",
    ),
    "undefined input": (lambda: _one("Add", ["x", "nope"], ["y"]), "reads 'nope', which no"),
    "cycle": (
        lambda: _two_nodes(("Add", ["x", "b"], ["a"]), ("Relu", ["a"], ["b"]), ("a",)),
        "the graph has a cycle",
    ),
    "output not produced": (
        lambda: _two_nodes(("Relu", ["x"], ["y"]), ("Neg", ["x"], ["n"]), ("y", "z")),
        "output 'z' is not produced",
    ),
    "no opset import": (_no_opsets, "imports no opset"),
    "IR version too new": (_ir_too_new, "supports IR versions up to"),
    "opset 0": (lambda: _opset(0), "ONNX opsets start at 1"),
    "opset too new": (lambda: _opset(onnx.defs.onnx_opset_version() + 1), "knows opsets up to"),
    "raw_data too short": (
        lambda: _weight(lambda t: setattr(t, "raw_data", b"\0" * 20)),
        "20 bytes of raw_data",
    ),
    "float_data too long": (
        lambda: _weight(lambda t: t.float_data.extend([1.0] * 7)),
        "7 entries in float_data",
    ),
    "tensor without data": (lambda: _weight(lambda t: None), "has no data"),
    "negative tensor dims": (lambda: _weight(_negative_tensor_dims), "negative dimension"),
    "too few inputs": (lambda: _one("Add", ["x"], ["y"]), "has 1 input; the op takes exactly 2"),
    "required input left empty": (lambda: _one("Gather", ["x", ""], ["y"]), "is required but"),
    "unknown attribute": (lambda: _one("Relu", ["x"], ["y"], alpha=0.5), "unknown attribute"),
    "attribute of the wrong type": (
        lambda: _one("Softmax", ["x"], ["y"], axis=1.5),
        "is FLOAT but the op declares INT",
    ),
    "required attribute missing": (
        lambda: _one("Cast", ["x"], ["y"]),
        "required attribute 'to' is missing",
    ),
    "string attribute not UTF-8": (_pad_mode_not_utf8, "attribute 'mode' is not valid UTF-8"),
    "axis out of range": (lambda: _one("Softmax", ["x"], ["y"], axis=5), "is out of range"),
    "perm not a permutation": (
        lambda: _one("Transpose", ["x"], ["y"], perm=[0, 0]),
        "is not a permutation",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_refusal_onnxep_keeps_is_one_onnxruntime_makes_too(case):
    build, pattern = REFUSED[case]
    model = build()
    with pytest.raises(OnnxepError, match=pattern):
        onnxep.InferenceSession(model, providers=["cpu"])
    with pytest.raises(Exception):  # noqa: B017 - onnxruntime's errors have no common class
        ort_session(model)  # refused at load, as onnxep refuses it at session creation
