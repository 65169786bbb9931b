"""ai.onnx.ml kernels on hand-built nodes, against onnxruntime (and onnx.reference where the
converters never emit the case): every tree node mode, aggregate and post transform,
double thresholds, integer inputs, map inputs and outputs, and the deprecation at opset 5."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxep
from onnxep.errors import OnnxepError
from onnxep.testing import compare_output

ort = pytest.importorskip("onnxruntime")
ML = "ai.onnx.ml"


def _model(op, inputs, outputs, ml_opset=3, **attrs):
    node = helper.make_node(
        op, [i.name for i in inputs], [o.name for o in outputs], domain=ML, **attrs
    )
    graph = helper.make_graph([node], "g", inputs, outputs)
    m = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, ml_opset)]
    )
    m.ir_version = 8
    return m.SerializeToString()


def _both(data, feeds, finite_only=False):
    """Run on both; ``finite_only`` compares only where onnxruntime's value is finite (PROBIT
    of a score outside [0, 1] is NaN or an infinity depending on its compiler's math)."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    want = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = onnxep.InferenceSession(data, providers=["cpu"]).run(None, feeds)
    for i, (g, w) in enumerate(zip(got, want)):
        if finite_only and isinstance(w, np.ndarray) and w.dtype.kind == "f":
            keep = np.isfinite(w)
            g, w = g[keep], w[keep]
        for r in compare_output(f"out{i}", g, w, "cpu", "onnxruntime"):
            assert r.ok, r.describe()
    return got


def _tensor(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


# Two trees over 3 features with every branch mode; tree 1 has a missing-value track.
def _tree_attrs(modes, prefix="target", n_out=2, double=False):
    values = [0.5, -0.25, 1.0, 0.0, 0.0, 0.0, 0.0, 0.3, 0.0, 0.0]
    attrs = dict(
        nodes_treeids=[0] * 7 + [1] * 3,
        nodes_nodeids=list(range(7)) + list(range(3)),
        nodes_featureids=[0, 1, 2, 0, 0, 0, 0, 2, 0, 0],
        nodes_modes=modes + ["LEAF"] * 4 + ["BRANCH_LEQ", "LEAF", "LEAF"],
        nodes_truenodeids=[1, 3, 5, 0, 0, 0, 0, 1, 0, 0],
        nodes_falsenodeids=[2, 4, 6, 0, 0, 0, 0, 2, 0, 0],
        nodes_missing_value_tracks_true=[0, 1, 0, 0, 0, 0, 0, 1, 0, 0],
        **{
            f"{prefix}_treeids": [0, 0, 0, 0, 1, 1, 0, 1],
            f"{prefix}_nodeids": [3, 4, 5, 6, 1, 2, 3, 2],
            f"{prefix}_ids": [0, 0, 1, 1, 0, 1, n_out - 1, 0],
            f"{prefix}_weights": [1.5, -2.0, 0.7, 3.1, 0.25, -0.5, 0.125, 1.0],
        },
    )
    if double:
        attrs["nodes_values_as_tensor"] = helper.make_tensor(
            "v", TensorProto.DOUBLE, [len(values)], np.array(values) + 1e-9
        )
    else:
        attrs["nodes_values"] = values
    return attrs


def _x(dtype=np.float32, nan=True):
    rng = np.random.default_rng(0)
    x = rng.choice([-1.0, -0.25, 0.0, 0.3, 0.5, 1.0, 2.0], size=(40, 3)).astype(dtype)
    if nan and dtype in (np.float32, np.float64):
        x[::5, 1] = np.nan
        x[2::7, 0] = np.nan
        x[3::6, 2] = np.nan
    return x


MODES = [
    ["BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE"],
    ["BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ"],
    ["BRANCH_NEQ", "BRANCH_GTE", "BRANCH_LT"],
]


@pytest.mark.parametrize("modes", MODES)
@pytest.mark.parametrize("agg", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"])
def test_tree_regressor_modes_aggregates_post(modes, agg, post):
    attrs = _tree_attrs(modes)
    attrs["base_values"] = [0.1, -0.2]
    data = _model(
        "TreeEnsembleRegressor",
        [_tensor("X", TensorProto.FLOAT, [None, 3])],
        [_tensor("Y", TensorProto.FLOAT, [None, 2])],
        n_targets=2,
        aggregate_function=agg,
        post_transform=post,
        **attrs,
    )
    _both(data, {"X": _x()}, finite_only=post == "PROBIT")


@pytest.mark.parametrize("dtype", [np.float64])  # onnxruntime has no int kernel
@pytest.mark.parametrize("double", [False, True])
def test_tree_regressor_input_and_threshold_types(dtype, double):
    attrs = _tree_attrs(MODES[0], double=double)
    elem = {
        np.float64: TensorProto.DOUBLE,
        np.int64: TensorProto.INT64,
        np.int32: TensorProto.INT32,
    }
    data = _model(
        "TreeEnsembleRegressor",
        [_tensor("X", elem[dtype], [None, 3])],
        [_tensor("Y", TensorProto.FLOAT, [None, 1])],
        n_targets=1,
        post_transform="PROBIT",
        base_values=[0.2],
        **{
            **attrs,
            "target_ids": [0] * 8,
            "target_weights": [0.1, 0.2, 0.05, 0.3, 0.1, 0.2, 0.1, 0.0],
        },
    )
    _both(data, {"X": _x(dtype, nan=False) * (1 if dtype == np.float64 else 2)})


# Binary classifiers whose leaves weight the classes partly and mixed in sign (no converter
# writes them) follow other column rules in onnxruntime than these; see docs/ml_domain.md.
@pytest.mark.parametrize("labels", [[3, 5, 7], ["a", "b", "c"], [1, 2, 3, 4]])
@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"])
@pytest.mark.parametrize("base", [None, [0.3], [0.1, -0.4]])
def test_tree_classifier_label_rules(labels, post, base):
    n = len(labels)
    attrs = _tree_attrs(MODES[1], prefix="class", n_out=n)
    if n == 2 and isinstance(labels[0], int) and labels[0] == 0:
        attrs["class_ids"] = [0] * 8  # one weighted class: the binary rules
    key = "classlabels_strings" if isinstance(labels[0], str) else "classlabels_int64s"
    if base is not None:
        attrs["base_values"] = base + [0.0] * (n - len(base)) if n > 2 else base
    lab_type = TensorProto.STRING if isinstance(labels[0], str) else TensorProto.INT64
    data = _model(
        "TreeEnsembleClassifier",
        [_tensor("X", TensorProto.FLOAT, [None, 3])],
        [_tensor("Y", lab_type, [None]), _tensor("Z", TensorProto.FLOAT, [None, n])],
        post_transform=post,
        **{key: labels},
        **attrs,
    )
    _both(data, {"X": _x()}, finite_only=post == "PROBIT")


def test_tree_ops_deprecated_at_opset_5():
    attrs = _tree_attrs(MODES[0])
    data = _model(
        "TreeEnsembleRegressor",
        [_tensor("X", TensorProto.FLOAT, [None, 3])],
        [_tensor("Y", TensorProto.FLOAT, [None, 2])],
        ml_opset=5,
        n_targets=2,
        **attrs,
    )
    with pytest.raises(onnxep.errors.NotImplementedOp, match="deprecated from ai.onnx.ml opset 5"):
        onnxep.InferenceSession(data, providers=["cpu"])


def test_category_mapper_both_ways():
    cats = dict(cats_strings=["a", "b", "c"], cats_int64s=[7, 8, 9], default_int64=-5)
    data = _model(
        "CategoryMapper",
        [_tensor("X", TensorProto.STRING, [None])],
        [_tensor("Y", TensorProto.INT64, [None])],
        **cats,
    )
    _both(data, {"X": np.array(["a", "c", "z", "b"], dtype=object)})
    data = _model(
        "CategoryMapper",
        [_tensor("X", TensorProto.INT64, [2, 2])],
        [_tensor("Y", TensorProto.STRING, [2, 2])],
        default_string="?",
        **cats,
    )
    _both(data, {"X": np.array([[7, 1], [9, 8]], np.int64)})


def test_feature_vectorizer_cuts_and_pads():
    data = _model(
        "FeatureVectorizer",
        [_tensor("A", TensorProto.FLOAT, [None, 3]), _tensor("B", TensorProto.FLOAT, [None, 2])],
        [_tensor("Y", TensorProto.FLOAT, [None, 6])],
        inputdimensions=[2, 4],
    )
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    _both(data, {"A": a, "B": np.arange(8, dtype=np.float32).reshape(4, 2)})


@pytest.mark.parametrize("cast_to", ["TO_FLOAT", "TO_INT64"])
@pytest.mark.parametrize("form", ["DENSE", "SPARSE"])
def test_cast_map(cast_to, form):
    vin = helper.make_value_info(
        "X", helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(1, None))
    )
    elem = TensorProto.FLOAT if cast_to == "TO_FLOAT" else TensorProto.INT64
    data = _model(
        "CastMap", [vin], [_tensor("Y", elem, [1, None])], cast_to=cast_to, map_form=form, max_map=6
    )
    _both(data, {"X": {4: 2.5, 1: -1.0, 0: 3.0}})


def test_label_encoder_float_to_string_against_onnxruntime():
    data = _model(
        "LabelEncoder",
        [_tensor("X", TensorProto.FLOAT, [None])],
        [_tensor("Y", TensorProto.STRING, [None])],
        ml_opset=2,
        keys_floats=[0.5, 1.0, -2.0],
        values_strings=["half", "one", "minus two"],
        default_string="other",
    )
    _both(data, {"X": np.array([1.0, 0.5, 3.0, -2.0], np.float32)})


def test_zipmap_output_types_and_shape_check():
    data = _model(
        "ZipMap",
        [_tensor("X", TensorProto.FLOAT, [None, None])],
        [
            helper.make_value_info(
                "Y",
                helper.make_sequence_type_proto(
                    helper.make_map_type_proto(
                        TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, [])
                    )
                ),
            )
        ],
        classlabels_int64s=[3, 1],
    )
    (got,) = _both(data, {"X": np.array([[0.25, 0.75], [1.0, 0.0]], np.float32)})
    assert got == [{3: 0.25, 1: 0.75}, {3: 1.0, 1: 0.0}]
    sess = onnxep.InferenceSession(data, providers=["cpu"])
    assert sess.get_outputs()[0].type == "seq(map(int64,tensor(float)))"
    with pytest.raises(onnxep.errors.RunError, match="one column per label"):
        sess.run(None, {"X": np.zeros((2, 3), np.float32)})


def test_wrapped_errors_carry_innermost_cause():
    from onnxep.errors import with_cause

    try:
        try:
            raise NotImplementedError("Map types are not supported yet")
        except NotImplementedError as inner:
            raise RuntimeError("Error calling _deserialize_graph") from inner
    except RuntimeError as exc:
        text = with_cause(exc)
    assert "RuntimeError: Error calling _deserialize_graph" in text
    assert "innermost cause: NotImplementedError: Map types are not supported yet" in text


def test_tree_model_errors_name_the_problem():
    attrs = _tree_attrs(MODES[0])
    attrs["nodes_truenodeids"] = [1, 3, 9, 0, 0, 0, 0, 1, 0, 0]
    data = _model(
        "TreeEnsembleRegressor",
        [_tensor("X", TensorProto.FLOAT, [None, 3])],
        [_tensor("Y", TensorProto.FLOAT, [None, 2])],
        n_targets=2,
        **attrs,
    )
    with pytest.raises(onnxep.errors.NotImplementedOp, match="true node 9, which the tree"):
        onnxep.InferenceSession(data, providers=["cpu"])
    ok = _model(
        "TreeEnsembleRegressor",
        [_tensor("X", TensorProto.FLOAT, [None, None])],
        [_tensor("Y", TensorProto.FLOAT, [None, 2])],
        n_targets=2,
        **_tree_attrs(MODES[0]),
    )
    sess = onnxep.InferenceSession(ok, providers=["cpu"])
    with pytest.raises(onnxep.errors.RunError, match="reads feature 2, but the input has 2"):
        sess.run(None, {"X": np.zeros((3, 2), np.float32)})
    onnx.checker  # noqa: B018 - the models above are built with onnx.helper


def test_coverage_report_lists_every_ml_op(capsys):
    import onnx

    from onnxep.tools.cli import main
    from onnxep.tools.coverage import coverage

    rows = coverage(["cpu"], ["ai.onnx.ml", "com.microsoft"])
    ml = {r.op: r for r in rows if r.domain == "ai.onnx.ml"}
    schema_ops = {s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain == ML}
    assert set(ml) >= schema_ops
    assert all(r.covered for r in ml.values())
    assert ml["TreeEnsembleClassifier"].deprecated_from == 5
    assert any(r.domain == "com.microsoft" for r in rows)
    assert main(["coverage", "--domains", "ai.onnx.ml"]) == 0
    out = capsys.readouterr().out
    assert "ai.onnx.ml: 19 of 19 ops have a kernel" in out


# --- LinearClassifier / LinearRegressor: coefficients read by the input's width -------------


def _linear(op, n_feat, coef, rows, **attrs):
    x = _tensor("X", TensorProto.FLOAT, [None, None])
    if op == "LinearClassifier":
        outs = [_tensor("Y", TensorProto.INT64, [None]), _tensor("Z", TensorProto.FLOAT, None)]
        attrs = dict(
            classlabels_ints=list(range(2 if rows == 1 else rows)),
            intercepts=list(np.linspace(-0.5, 0.5, rows)),
            **attrs,
        )
    else:
        outs = [_tensor("Y", TensorProto.FLOAT, None)]
        attrs = dict(targets=rows, intercepts=list(np.linspace(-0.5, 0.5, rows)), **attrs)
    return _model(op, [x], outs, ml_opset=1, coefficients=list(coef), **attrs)


@pytest.mark.parametrize("op", ["LinearClassifier", "LinearRegressor"])
@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("n_feat, per_row", [(2, 4), (3, 3), (1, 5), (4, 4)])
@pytest.mark.parametrize("n", [0, 1, 5])
def test_linear_coefficients_by_input_width(op, rows, n_feat, per_row, n):
    # onnxruntime's own logreg_iris.onnx declares 2 features and holds 4 coefficients a class:
    # onnxruntime reads them as rows of the input's width (the first rows x width values), and
    # so must onnxep, for any count at least that long; a regressor's count need not be a
    # whole number of rows (a classifier's must, on both)
    extra = int(op == "LinearRegressor" and n_feat == 3)
    coef = np.random.default_rng(rows * 7 + n_feat).normal(size=rows * per_row + extra)
    x = np.random.default_rng(n).normal(size=(n, n_feat)).astype(np.float32)
    post = "LOGISTIC" if rows == 3 else "NONE"
    got = _both(_linear(op, n_feat, coef, rows, post_transform=post), {"X": x})
    w = coef[: rows * n_feat].reshape(rows, n_feat)
    scores = x.astype(np.float64) @ w.T + np.linspace(-0.5, 0.5, rows)
    if op == "LinearClassifier" and rows == 3:
        np.testing.assert_array_equal(got[0], np.argmax(scores, axis=1))
    if op == "LinearRegressor":
        want = 1 / (1 + np.exp(-scores)) if post == "LOGISTIC" else scores
        np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["LinearClassifier", "LinearRegressor"])
def test_linear_coefficients_left_unused_are_reported(op):
    # 3 rows of 4 coefficients on inputs 2 wide: onnxruntime's reading runs, and says so
    data = _linear(op, 2, np.arange(12.0), 3)
    sess = onnxep.InferenceSession(data, providers=["cpu"])
    x = np.ones((2, 2), np.float32)
    with pytest.warns(UserWarning, match=r"6 of the node's 12 coefficients are used"):
        sess.run(None, {"X": x})


@pytest.mark.parametrize("op", ["LinearClassifier", "LinearRegressor"])
def test_linear_too_few_coefficients_refused(op):
    # 3 rows of 4 features take 12 coefficients; with 9 onnxruntime refuses the run too
    data = _linear(op, 4, np.ones(9), 3)
    sess = onnxep.InferenceSession(data, providers=["cpu"])
    with pytest.raises(OnnxepError, match="4 features per row, which takes 12 .* holds 9"):
        sess.run(None, {"X": np.ones((2, 4), np.float32)})
    # the same node runs inputs narrow enough for its coefficients
    sess.run(None, {"X": np.ones((2, 3), np.float32)})


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
@pytest.mark.parametrize(
    "x",
    [
        np.array([[1.0, -2.0, 3.0], [0.0, 0.0, 0.0], [-1.0, 1.0, 0.0], [np.nan, 1.0, 2.0]]),
        np.array([[0.5, 0.25], [-3.0, 4.0]]),
        np.zeros((0, 3)),
        np.array([[1, 2, -3], [4, 0, 0]]),
    ],
    ids=["zero-and-nan-rows", "plain", "no-rows", "int64"],
)
def test_normalizer_against_onnxruntime(norm, x):
    # every row's norm nonzero takes one division, any zero norm the guarded path: both must
    # give onnxruntime's values (a zero-norm row unchanged, NaN through)
    elem = TensorProto.INT64 if x.dtype.kind == "i" else TensorProto.FLOAT
    x = x.astype(np.int64 if elem == TensorProto.INT64 else np.float32)
    data = _model(
        "Normalizer",
        [_tensor("X", elem, [None, x.shape[1]])],
        [_tensor("Y", TensorProto.FLOAT, None)],
        ml_opset=1,
        norm=norm,
    )
    (got,) = _both(data, {"X": x})
    assert got.dtype == np.float32 and got.shape == x.shape
