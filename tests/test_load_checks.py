"""Models are checked when the session is created, not at the first run.

Versions newer than the installed onnx, nodes that break their op schema,
axes outside a known rank and tensor data that does not fill its dims are
refused with an ``InvalidModel`` naming what is wrong; Python lists given as
feeds take the input's declared type. What onnxruntime runs as it is (a
negative dim, text that is not UTF-8...) is read in a normal form instead,
with a load note: tests/test_load_notes.py.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnx.defs
import pytest
from conftest import make_model, save, tensor
from onnx import TensorProto, checker, helper, numpy_helper

import onnxep
from onnxep.errors import InvalidArgument, InvalidModel
from onnxep.schema_checks import UNCHECKED_ATTRIBUTES


def session(model):
    return onnxep.InferenceSession(model, providers=["cpu"])


def relu_model(**kw):
    return make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [tensor("x", [2, 3])],
        [tensor("y", [2, 3])],
        **kw,
    )


# -- versions ----------------------------------------------------------------------


def test_opset_newer_than_onnx_is_refused_naming_both_versions():
    newest = onnx.defs.onnx_opset_version()
    with pytest.raises(InvalidModel, match=f"opset {newest + 1} of the default.*up to {newest}"):
        session(relu_model(opset=newest + 1))


def test_ir_version_newer_than_onnx_is_refused_naming_both_versions():
    m = relu_model()
    m.ir_version = onnx.IR_VERSION + 1
    with pytest.raises(InvalidModel, match=f"IR version {m.ir_version}.*up to {onnx.IR_VERSION}"):
        session(m)


def test_ml_domain_opset_is_limited_too():
    newest = onnx.defs.onnx_ml_opset_version()
    m = relu_model(extra_opsets=[("ai.onnx.ml", newest + 1)])
    with pytest.raises(InvalidModel, match=f"opset {newest + 1} of 'ai.onnx.ml'.*up to {newest}"):
        session(m)


def test_custom_domain_versions_are_not_limited():
    m = relu_model(extra_opsets=[("com.microsoft", 1000)])
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(session(m).run(None, {"x": x})[0], x)


def test_duplicate_graph_input_names_are_refused():
    m = make_model(
        [helper.make_node("Relu", ["x"], ["y"])],
        [tensor("x", [2]), tensor("x", [2])],
        [tensor("y", [2])],
    )
    with pytest.raises(InvalidModel, match="input 'x' is declared twice"):
        session(m)


# -- op schemas: arity and attributes --------------------------------------------------


def one_node(node, inputs=(("x", [2, 3]),), out_shape=None, opset=17, inits=()):
    return make_model(
        [node],
        [tensor(n, s) for n, s in inputs],
        [tensor(o, out_shape) for o in node.output if o][:1],
        inits=inits,
        opset=opset,
    )


@pytest.mark.parametrize(
    "node, inputs, pattern",
    [
        (
            helper.make_node("Add", ["x"], ["y"], name="add"),
            [("x", [2, 3])],
            r"Add node 'add' .*opset 17, schema Add-14\): has 1 input; the op takes exactly 2",
        ),
        (
            helper.make_node("Relu", ["x", "x"], ["y"]),
            [("x", [2, 3])],
            r"Relu node 'Relu_0' .*has 2 inputs; the op takes exactly 1",
        ),
        (
            helper.make_node("Relu", ["x"], ["y", "z"], name="r"),
            [("x", [2, 3])],
            r"Relu node 'r' .*has 2 outputs; the op takes exactly 1",
        ),
        (
            helper.make_node("Concat", [], ["y"], name="c", axis=0),
            [("x", [2, 3])],
            r"Concat node 'c' .*has 0 inputs; the op takes at least 1",
        ),
        (
            helper.make_node("Gather", ["x", ""], ["y"], name="g"),
            [("x", [2, 3])],
            r"Gather node 'g' .*input 1 \(indices\) is required but left empty",
        ),
        (
            helper.make_node("Relu", ["x"], ["y"], name="r", alpha=0.5),
            [("x", [2, 3])],
            r"Relu node 'r' .*unknown attribute 'alpha'",
        ),
        (
            helper.make_node("Softmax", ["x"], ["y"], name="s", axis=1.5),
            [("x", [2, 3])],
            r"Softmax node 's' .*attribute 'axis' is FLOAT but the op declares INT",
        ),
        (
            helper.make_node("Cast", ["x"], ["y"], name="c"),
            [("x", [2, 3])],
            r"Cast node 'c' .*required attribute 'to' is missing",
        ),
    ],
)
def test_node_breaking_its_schema_is_refused_at_creation(node, inputs, pattern):
    with pytest.raises(InvalidModel, match=pattern):
        session(one_node(node, inputs))


def test_string_attribute_of_an_onnx_op_must_be_utf8():
    node = helper.make_node("Pad", ["x"], ["y"], name="p", mode="constant", pads=[0, 0, 0, 0])
    node.attribute[0].s = b"\xffconstant"
    with pytest.raises(InvalidModel, match="'p' .*attribute 'mode' is not valid UTF-8"):
        session(one_node(node, opset=10))


def test_attribute_given_twice_is_refused():
    node = helper.make_node("Softmax", ["x"], ["y"], name="s", axis=1)
    node.attribute.append(helper.make_attribute("axis", 0))
    with pytest.raises(InvalidModel, match="attribute 'axis' is given twice"):
        session(one_node(node))


def test_tensor_attribute_without_a_value_is_refused():
    node = helper.make_node("Constant", [], ["y"], name="k")
    attr = node.attribute.add()
    attr.name, attr.type = "value", onnx.AttributeProto.TENSOR
    with pytest.raises(
        InvalidModel, match="Constant node 'k' .*attribute 'value' is TENSOR but has no value"
    ):
        session(one_node(node, inputs=()))


def test_attribute_type_must_match_its_value_even_without_a_schema():
    # com.microsoft ops have no onnx schema; onnx-ir reads a value by its declared type.
    node = helper.make_node("FastGelu", ["x"], ["y"], name="fg", domain="com.microsoft")
    attr = node.attribute.add()
    attr.name, attr.type, attr.i = "extra", onnx.AttributeProto.TENSOR, 3
    m = make_model(
        [node], [tensor("x", [2])], [tensor("y", [2])], extra_opsets=[("com.microsoft", 1)]
    )
    with pytest.raises(
        InvalidModel, match="'fg' .*attribute 'extra' is TENSOR but sets the INT field 'i'"
    ):
        session(m)


def test_nodes_in_subgraphs_are_checked():
    bad = helper.make_node("Add", ["x"], ["t"], name="inner_add")
    then = helper.make_graph([bad], "then", [], [tensor("t", [2, 3])])
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"])], "else", [], [tensor("e", [2, 3])]
    )
    m = make_model(
        [helper.make_node("If", ["c"], ["y"], name="if", then_branch=then, else_branch=other)],
        [tensor("c", [], TensorProto.BOOL), tensor("x", [2, 3])],
        [tensor("y", [2, 3])],
    )
    with pytest.raises(
        InvalidModel, match="Add node 'inner_add' in graph 'g' > If 'if'.*has 1 input"
    ):
        session(m)


def test_ops_without_an_onnx_schema_are_left_to_the_providers():
    # onnxruntime-genai's builder puts SimplifiedLayerNormalization in the default domain.
    scale = numpy_helper.from_array(np.ones(3, np.float32), "scale")
    node = helper.make_node(
        "SimplifiedLayerNormalization", ["x", "scale"], ["y"], axis=-1, epsilon=1e-6
    )
    sess = session(one_node(node, out_shape=[2, 3], inits=[scale]))
    x = np.full((2, 3), 2.0, np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], np.ones((2, 3)), rtol=1e-5)


def test_layer_normalization_keeps_onnx_leniency_on_attributes():
    scale = numpy_helper.from_array(np.ones(3, np.float32), "scale")
    node = helper.make_node("LayerNormalization", ["x", "scale"], ["y"], axis=-1, extra=1)
    sess = session(one_node(node, out_shape=[2, 3], inits=[scale]))
    assert sess.run(None, {"x": np.ones((2, 3), np.float32)})[0].shape == (2, 3)


def test_unchecked_attribute_ops_match_onnx_checker():
    """onnx does not expose AllowUncheckedAttributes; probe its checker for the same set."""
    found = set()
    for schema in onnx.defs.get_all_schemas():
        if schema.deprecated:
            continue
        inputs = [f"i{k}" for k in range(schema.min_input)]
        outputs = [f"o{k}" for k in range(max(schema.min_output, 1))]
        node = helper.make_node(schema.name, inputs, outputs, domain=schema.domain, zz_probe=1)
        ctx = checker.C.CheckerContext()
        ctx.ir_version = onnx.IR_VERSION
        ctx.opset_imports = {
            "": onnx.defs.onnx_opset_version(),
            schema.domain: schema.since_version,
        }
        try:
            checker.check_node(node, ctx)
        except checker.ValidationError as exc:
            if "zz_probe" not in str(exc):
                continue  # refused for another reason first: the probe says nothing
        else:
            found.add((schema.domain, schema.name))
    assert found == set(UNCHECKED_ATTRIBUTES)


# -- axes against known ranks ----------------------------------------------------------


@pytest.mark.parametrize(
    "node, opset, pattern",
    [
        (helper.make_node("Gather", ["x", "i"], ["y"], name="g", axis=2), 17, r"\[-2, 1\]"),
        (helper.make_node("Softmax", ["x"], ["y"], name="s", axis=-3), 17, r"'axis' = -3"),
        (helper.make_node("Concat", ["x", "x"], ["y"], name="c", axis=2), 17, r"\[-2, 1\]"),
        (helper.make_node("Flatten", ["x"], ["y"], name="f", axis=3), 17, r"\[-2, 2\]"),
        (helper.make_node("Unsqueeze", ["x"], ["y"], name="u", axes=[0, 4]), 11, r"\[-4, 3\]"),
        (helper.make_node("ReduceSum", ["x"], ["y"], name="r", axes=[0, 2]), 11, r"\[0, 2\]"),
        (helper.make_node("Split", ["x"], ["y"], name="sp", axis=-5), 17, r"'axis' = -5"),
        (helper.make_node("ArgMax", ["x"], ["y"], name="a", axis=9), 17, r"'axis' = 9"),
    ],
)
def test_axis_outside_known_rank_is_refused(node, opset, pattern):
    i = numpy_helper.from_array(np.zeros(1, np.int64), "i")
    m = one_node(node, opset=opset, inits=[i] if "i" in node.input else [])
    with pytest.raises(InvalidModel, match=f"node '{node.name}' .*{pattern}"):
        session(m)


@pytest.mark.parametrize("perm", [[0, 0], [1, 2], [0]])
def test_transpose_perm_must_permute_the_known_axes(perm):
    node = helper.make_node("Transpose", ["x"], ["y"], name="t", perm=perm)
    with pytest.raises(InvalidModel, match=r"'t'.*'perm' = .* is not a permutation .* rank 2"):
        session(one_node(node))


@pytest.mark.parametrize(
    "node, opset, shape",
    [
        (helper.make_node("Flatten", ["x"], ["y"], axis=2), 17, (6, 1)),
        (helper.make_node("Unsqueeze", ["x"], ["y"], axes=[0, 3]), 11, (1, 2, 3, 1)),
        (helper.make_node("Softmax", ["x"], ["y"], axis=-2), 17, (2, 3)),
        (helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0]), 17, (3, 2)),
    ],
)
def test_axis_at_the_edge_of_its_range_loads(node, opset, shape):
    sess = session(one_node(node, opset=opset))
    assert sess.run(None, {"x": np.ones((2, 3), np.float32)})[0].shape == shape


def test_axis_is_not_checked_when_the_rank_is_unknown():
    node = helper.make_node("Softmax", ["x"], ["y"], name="s", axis=2)
    m = make_model([node], [tensor("x", None)], [tensor("y", None)])
    sess = session(m)  # the rank is known only at run time, where the kernel checks it
    assert sess.run(None, {"x": np.ones((1, 2, 3), np.float32)})[0].shape == (1, 2, 3)


def test_axis_in_a_subgraph_is_checked_against_the_outer_rank():
    body = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["t"], name="inner", axis=4)],
        "then",
        [],
        [tensor("t", [2, 3])],
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e"])], "else", [], [tensor("e", [2, 3])]
    )
    m = make_model(
        [helper.make_node("If", ["c"], ["y"], then_branch=body, else_branch=other)],
        [tensor("c", [], TensorProto.BOOL), tensor("x", [2, 3])],
        [tensor("y", [2, 3])],
    )
    with pytest.raises(InvalidModel, match="Softmax node 'inner' in graph 'g' > If"):
        session(m)


# -- tensor data -----------------------------------------------------------------------


def add_weight_model(weight: onnx.TensorProto):
    return make_model(
        [helper.make_node("Add", ["x", "W"], ["y"])],
        [tensor("x", [4, 3])],
        [tensor("y", [4, 3])],
        inits=[weight],
    )


def test_short_raw_data_is_refused_naming_the_tensor():
    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "W")
    w.raw_data = w.raw_data[:20]
    with pytest.raises(
        InvalidModel, match=r"'W' .*20 bytes of raw_data.*\[4, 3\] of FLOAT need 48"
    ):
        session(add_weight_model(w))


def test_short_float_data_is_refused_naming_the_tensor():
    w = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[4, 3])
    w.float_data.extend([1.0] * 5)
    with pytest.raises(
        InvalidModel, match=r"'W' of graph 'g' has 5 entries in float_data.*need 12"
    ):
        session(add_weight_model(w))


def test_tensor_without_data_is_refused():
    w = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[4, 3])
    with pytest.raises(InvalidModel, match=r"'W' of graph 'g' has no data"):
        session(add_weight_model(w))


def external_model(tmp_path, **entries):
    """A model whose W (48 bytes) lives in w.bin, with its external_data entries replaced."""
    (tmp_path / "w.bin").write_bytes(np.ones((4, 3), np.float32).tobytes())
    w = TensorProto(name="W", data_type=TensorProto.FLOAT, dims=[4, 3])
    w.data_location = TensorProto.EXTERNAL
    for key, value in {"location": "w.bin", **entries}.items():
        w.external_data.add(key=key, value=str(value))
    return save(add_weight_model(w), tmp_path / "m.onnx")


def test_external_data_without_length_reads_what_the_dims_need(tmp_path):
    # onnx alone would read from the offset to the end of the file (60 bytes here).
    path = external_model(tmp_path, offset=4)
    (tmp_path / "w.bin").write_bytes(np.arange(16, dtype=np.float32).tobytes())
    out = session(str(path)).run(None, {"x": np.zeros((4, 3), np.float32)})[0]
    np.testing.assert_array_equal(out, np.arange(1, 13, dtype=np.float32).reshape(4, 3))


def test_external_data_in_range_loads(tmp_path):
    sess = session(str(external_model(tmp_path, offset=0, length=48)))
    out = sess.run(None, {"x": np.zeros((4, 3), np.float32)})[0]
    np.testing.assert_array_equal(out, np.ones((4, 3)))


@pytest.mark.parametrize(
    "entries, pattern",
    [
        ({"offset": 40}, r"offset 40, length None, file size 48\) runs past the end"),
        ({"offset": 8, "length": 48}, r"offset 8, length 48, file size 48\) runs past the end"),
        ({"length": 24}, r"holds 24 bytes, but dims \[4, 3\] of FLOAT need 48"),
        ({"offset": "ten"}, r"external_data offset 'ten', which is not an integer"),
        ({"offest": 0}, r"unknown external_data key 'offest'"),
        ({"length": -4}, r"negative external_data length"),
    ],
)
def test_external_data_outside_its_file_is_refused(tmp_path, entries, pattern):
    path = external_model(tmp_path, **entries)
    with pytest.raises(InvalidModel, match=rf"tensor 'W'.*{pattern}"):
        session(str(path))


def test_hard_linked_external_data_is_an_onnxep_error(tmp_path):
    # onnx refuses a hard-linked data file (a "hardlink attack") with its own ValidationError.
    path = external_model(tmp_path)
    os.link(tmp_path / "w.bin", tmp_path / "alias.bin")
    with pytest.raises(InvalidModel, match="hard links"):
        session(str(path))


def test_external_data_file_shorter_than_dims(tmp_path):
    path = external_model(tmp_path)
    (tmp_path / "w.bin").write_bytes(b"\0" * 12)
    with pytest.raises(InvalidModel, match=r"'w.bin' \(offset 0, length None, file size 12\)"):
        session(str(path))


def test_element_type_outside_onnx_data_types_is_refused():
    m = relu_model()
    m.graph.input[0].type.tensor_type.elem_type = 99
    with pytest.raises(InvalidModel, match="value 'x' declares element type 99"):
        session(m)


def test_custom_domain_with_a_huge_version_is_left_to_the_providers():
    node = helper.make_node("Relu", ["x"], ["y"], name="r", domain="my.ops")
    m = make_model([node], [tensor("x", [2])], [tensor("y", [2])], extra_opsets=[("my.ops", 2**40)])
    with pytest.raises(onnxep.errors.NotImplementedOp, match="'r'"):
        session(m)


# -- Python values as feeds ----------------------------------------------------------------


def identity_session(shape, elem):
    m = make_model(
        [helper.make_node("Identity", ["x"], ["y"])],
        [tensor("x", shape, elem)],
        [tensor("y", shape, elem)],
    )
    return session(m)


@pytest.mark.parametrize(
    "elem, feed, want",
    [
        (TensorProto.FLOAT, [[1, 2.5, 3]], np.array([[1, 2.5, 3]], np.float32)),
        (TensorProto.FLOAT16, [[1, 2, 3]], np.array([[1, 2, 3]], np.float16)),
        (TensorProto.INT64, [[1, 2.0, 3]], np.array([[1, 2, 3]], np.int64)),
        (TensorProto.INT32, ((4, 5, 6),), np.array([[4, 5, 6]], np.int32)),
        (TensorProto.BOOL, [[True, 0, 1]], np.array([[True, False, True]])),
    ],
)
def test_python_lists_take_the_declared_type(elem, feed, want):
    out = identity_session([1, 3], elem).run(None, {"x": feed})[0]
    assert out.dtype == want.dtype
    np.testing.assert_array_equal(out, want)


def test_python_scalar_takes_the_declared_type():
    out = identity_session([], TensorProto.FLOAT).run(None, {"x": 7})[0]
    assert out.dtype == np.float32 and out.shape == () and out == 7


@pytest.mark.parametrize(
    "elem, feed, pattern",
    [
        (TensorProto.INT64, [[1, 2.5, 3]], r"'x' is tensor\(int64\), but the value 2.5"),
        (TensorProto.UINT8, [[1, 300, 3]], r"the value 300 .*uint8"),
        (TensorProto.BOOL, [[1, 2, 0]], r"the value 2 .*bool"),
        (TensorProto.FLOAT16, [[1, 1e6, 3]], r"the value 1000000.0 .*float16"),
        (TensorProto.FLOAT, [[1, 2], [3]], r"'x': the list given cannot be made into an array"),
        (TensorProto.FLOAT, [["a", "b", "c"]], r"'x' is tensor\(float\); the values given"),
    ],
)
def test_python_list_that_cannot_convert_is_named(elem, feed, pattern):
    sess = identity_session([1, 3], elem)
    with pytest.raises(InvalidArgument, match=pattern):
        sess.run(None, {"x": feed})
    assert sess.run(None, {"x": [[0, 1, 0]]})[0].shape == (1, 3)  # the session is still usable


def test_random_inputs_for_an_input_without_element_type_is_an_onnxep_error():
    from onnxep.testing import random_inputs

    m = relu_model()
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.UNDEFINED
    sess = session(m)  # feeds are then checked by the kernels, as before
    with pytest.raises(InvalidArgument, match=r"tensor\(undefined\) names no element type"):
        random_inputs(sess)


def test_numpy_array_of_another_dtype_is_still_refused():
    sess = identity_session([1, 3], TensorProto.FLOAT)
    with pytest.raises(InvalidArgument, match="has dtype float64 but the model declares"):
        sess.run(None, {"x": np.ones((1, 3))})
    with pytest.raises(InvalidArgument, match="has dtype float64"):
        sess.run(None, {"x": np.float64(1.0)})
