"""The tree ensembles' compiled whole run (``tree_loops``: walk, sums, base values, argmax,
post transform in one numba call) against the NumPy path it replaces on a few rows and
against onnxruntime: every branch mode and missing-value track, every post transform and
aggregate, base values absent, partial and full, one and several targets, float, double
and integer inputs, 0 / 1 / few rows, and many rows split over threads."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxep
from onnxep.providers_cpu import jit
from onnxep.providers_cpu.ops import tree_eval
from onnxep.testing import compare_output

ort = pytest.importorskip("onnxruntime")
ML = "ai.onnx.ml"
POSTS = ["NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT"]

pytestmark = pytest.mark.skipif(not jit.ENABLED, reason="numba not available: no compiled run")


def _model(op, x_elem, outputs, width=4, **attrs):
    x = helper.make_tensor_value_info("X", x_elem, [None, width])
    node = helper.make_node(op, ["X"], [o.name for o in outputs], domain=ML, **attrs)
    graph = helper.make_graph([node], "g", [x], outputs)
    m = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 3)]
    )
    m.ir_version = 8
    return m.SerializeToString()


def _forest(modes, prefix, n_out, tracks, rng):
    """Three trees over 4 features: two of depth 2 (modes[0..2], then modes[3..5]) and a
    stump; every leaf weights one or two targets."""
    leaf_w = []
    nodes = dict(treeids=[], nodeids=[], featureids=[], modes=[], values=[], true=[], false=[])
    miss = []
    for tree, tm in enumerate([modes[:3], modes[3:6], modes[6:7]]):
        inner = len(tm)
        # node 0 -> 1, 2; node 1 -> 3, 4; node 2 -> 5, 6 (a stump: 0 -> 1, 2)
        kids = [(1, 2), (3, 4), (5, 6)][:inner]
        n_nodes = 2 * inner + 1
        for n in range(n_nodes):
            nodes["treeids"].append(tree)
            nodes["nodeids"].append(n)
            if n < inner:
                nodes["featureids"].append(int(rng.integers(0, 4)))
                nodes["modes"].append(tm[n])
                nodes["values"].append(float(rng.choice([-0.5, 0.0, 0.25, 1.0])))
                nodes["true"].append(kids[n][0])
                nodes["false"].append(kids[n][1])
                miss.append(tracks[(tree + n) % len(tracks)])
            else:
                nodes["featureids"].append(0)
                nodes["modes"].append("LEAF")
                nodes["values"].append(0.0)
                nodes["true"].append(0)
                nodes["false"].append(0)
                miss.append(0)
                for t in sorted(set(rng.integers(0, n_out, size=2).tolist())):
                    leaf_w.append((tree, n, t, float(rng.normal())))
    return dict(
        nodes_treeids=nodes["treeids"],
        nodes_nodeids=nodes["nodeids"],
        nodes_featureids=nodes["featureids"],
        nodes_modes=nodes["modes"],
        nodes_values=nodes["values"],
        nodes_truenodeids=nodes["true"],
        nodes_falsenodeids=nodes["false"],
        nodes_missing_value_tracks_true=miss,
        **{
            f"{prefix}_treeids": [w[0] for w in leaf_w],
            f"{prefix}_nodeids": [w[1] for w in leaf_w],
            f"{prefix}_ids": [w[2] for w in leaf_w],
            f"{prefix}_weights": [w[3] for w in leaf_w],
        },
    )


def _x(rows, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.choice([-1.0, -0.5, 0.0, 0.25, 0.3, 1.0, 2.0], size=(rows, 4)).astype(dtype)
    if dtype in (np.float32, np.float64) and rows:
        x[::5, 1] = np.nan
        x[2::7, 0] = np.nan
        x[3::4, 3] = np.inf
        x[1::6, 2] = -np.inf
    return x


def _ours_both_paths(data, x, monkeypatch):
    """(compiled, NumPy) outputs of one session: the NumPy path with jit.ENABLED off."""
    sess = onnxep.InferenceSession(data, providers=["cpu"])
    fused = sess.run(None, {"X": x})
    with monkeypatch.context() as m:
        m.setattr(jit, "ENABLED", False)
        numpy_path = sess.run(None, {"X": x})
    return fused, numpy_path


def _close(got, want, finite_only=False):
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if w.dtype.kind == "f":
            keep = np.isfinite(w) if finite_only else slice(None)
            np.testing.assert_allclose(g[keep], w[keep], rtol=2e-6, atol=1e-6)
        else:
            assert g.tolist() == w.tolist()


def _parity(got, want, probit=False):
    """Within the parity kit's tolerances of onnxruntime. Its PROBIT is float32 arithmetic
    (onnxep's float64, before and after this path), a cancellation near 0.5: there only the
    finite values, to 1e-4."""
    for i, (g, w) in enumerate(zip(got, want)):
        if probit and w.dtype.kind == "f":
            keep = np.isfinite(w)
            np.testing.assert_allclose(g[keep], w[keep], rtol=1e-3, atol=1e-4)
            continue
        for r in compare_output(f"out{i}", g, w, "cpu", "onnxruntime"):
            assert r.ok, r.describe()


def _theirs(data, x):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"]).run(None, {"X": x})


MODES = [
    ["BRANCH_LEQ"] * 7,
    ["BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_LEQ", "BRANCH_LT", "BRANCH_GT", "BRANCH_GTE"],
    ["BRANCH_GT", "BRANCH_GT", "BRANCH_LT", "BRANCH_GTE", "BRANCH_LEQ", "BRANCH_LEQ", "BRANCH_LT"],
]
TRACKS = [[0], [1], [0, 1, 1]]


@pytest.mark.parametrize("modes", range(len(MODES)))
@pytest.mark.parametrize("tracks", range(len(TRACKS)))
@pytest.mark.parametrize("post", POSTS)
@pytest.mark.parametrize("base", ["none", "partial", "full"])
def test_classifier_fused_matches_numpy_and_onnxruntime(modes, tracks, post, base, monkeypatch):
    rng = np.random.default_rng(modes * 10 + tracks)
    n = 4
    attrs = _forest(MODES[modes], "class", n, TRACKS[tracks], rng)
    if base != "none":
        attrs["base_values"] = [0.3, -0.2, 0.1, 0.05][: 2 if base == "partial" else n]
    data = _model(
        "TreeEnsembleClassifier",
        TensorProto.FLOAT,
        [
            helper.make_tensor_value_info("Y", TensorProto.INT64, [None]),
            helper.make_tensor_value_info("Z", TensorProto.FLOAT, [None, n]),
        ],
        post_transform=post,
        classlabels_int64s=[10, 20, 30, 40],
        **attrs,
    )
    x = _x(37)
    fused, numpy_path = _ours_both_paths(data, x, monkeypatch)
    _close(fused, numpy_path)
    if base != "partial":  # onnxruntime refuses base values for only some classes
        _parity(fused, _theirs(data, x), probit=post == "PROBIT")


@pytest.mark.parametrize("one_class", [False, True])
@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX", "PROBIT"])
@pytest.mark.parametrize("base", [0, 1, 2])
def test_two_classes_sums_compiled(one_class, post, base, monkeypatch):
    """Two classes: the compiled sums (and scored-class bits) under onnxruntime's two-class
    rules, both classes weighted (scikit-learn forests) or one (LightGBM, XGBoost), with
    0, 1 or 2 base values, against the NumPy path and onnxruntime."""
    rng = np.random.default_rng(base * 2 + one_class)
    attrs = _forest(MODES[1], "class", 2, TRACKS[2], rng)
    if one_class:
        attrs["class_ids"] = [1] * len(attrs["class_ids"])
        attrs["class_weights"] = [abs(w) for w in attrs["class_weights"]]
    else:  # every leaf weights both classes, as scikit-learn's forests do
        leaves = sorted(set(zip(attrs["class_treeids"], attrs["class_nodeids"])))
        attrs["class_treeids"] = [t for t, _ in leaves for _c in (0, 1)]
        attrs["class_nodeids"] = [n for _, n in leaves for _c in (0, 1)]
        attrs["class_ids"] = [0, 1] * len(leaves)
        attrs["class_weights"] = rng.uniform(0, 1, 2 * len(leaves)).tolist()
    if base:
        attrs["base_values"] = [0.2, -0.1][:base]
    data = _model(
        "TreeEnsembleClassifier",
        TensorProto.FLOAT,
        [
            helper.make_tensor_value_info("Y", TensorProto.INT64, [None]),
            helper.make_tensor_value_info("Z", TensorProto.FLOAT, [None, 2]),
        ],
        post_transform=post,
        classlabels_int64s=[3, 7],
        **attrs,
    )
    x = _x(41, seed=base)
    fused, numpy_path = _ours_both_paths(data, x, monkeypatch)
    _close(fused, numpy_path)
    _parity(fused, _theirs(data, x), probit=post == "PROBIT")


@pytest.mark.parametrize("modes", range(len(MODES)))
@pytest.mark.parametrize("agg", ["SUM", "AVERAGE", "MIN", "MAX"])
@pytest.mark.parametrize("post", POSTS)
@pytest.mark.parametrize("n_targets", [1, 3])
def test_regressor_fused_matches_numpy_and_onnxruntime(modes, agg, post, n_targets, monkeypatch):
    rng = np.random.default_rng(modes + 7)
    attrs = _forest(MODES[modes], "target", n_targets, TRACKS[2], rng)
    attrs["base_values"] = [0.5, -0.25, 1.5][:n_targets]
    data = _model(
        "TreeEnsembleRegressor",
        TensorProto.FLOAT,
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, n_targets])],
        n_targets=n_targets,
        aggregate_function=agg,
        post_transform=post,
        **attrs,
    )
    x = _x(29, seed=modes)
    fused, numpy_path = _ours_both_paths(data, x, monkeypatch)
    _close(fused, numpy_path)
    _parity(fused, _theirs(data, x), probit=post == "PROBIT")


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.int32])
def test_input_types(dtype, monkeypatch):
    attrs = _forest(MODES[1], "class", 3, TRACKS[2], np.random.default_rng(3))
    elem = {
        np.float64: TensorProto.DOUBLE,
        np.int64: TensorProto.INT64,
        np.int32: TensorProto.INT32,
    }
    data = _model(
        "TreeEnsembleClassifier",
        elem[dtype],
        [
            helper.make_tensor_value_info("Y", TensorProto.STRING, [None]),
            helper.make_tensor_value_info("Z", TensorProto.FLOAT, [None, 3]),
        ],
        post_transform="SOFTMAX",
        classlabels_strings=["a", "b", "c"],
        base_values=[0.1, 0.2, 0.3],
        **attrs,
    )
    x = _x(23, dtype) if dtype == np.float64 else _x(23, dtype) * 3
    fused, numpy_path = _ours_both_paths(data, x, monkeypatch)
    _close(fused, numpy_path)
    if dtype == np.float64:  # onnxruntime has no integer kernel
        _parity(fused, _theirs(data, x))


def _classifier(width=4):
    attrs = _forest(MODES[0], "class", 3, TRACKS[1], np.random.default_rng(11))
    return _model(
        "TreeEnsembleClassifier",
        TensorProto.FLOAT,
        [
            helper.make_tensor_value_info("Y", TensorProto.INT64, [None]),
            helper.make_tensor_value_info("Z", TensorProto.FLOAT, [None, 3]),
        ],
        width=width,
        post_transform="SOFTMAX",
        classlabels_int64s=[0, 1, 2],
        base_values=[0.1, 0.2, 0.3],
        **attrs,
    )


def test_rows_zero_one_and_past_the_walk_limit(monkeypatch):
    data = _classifier()
    for rows in (0, 1, 5):
        fused, numpy_path = _ours_both_paths(data, _x(rows), monkeypatch)
        _close(fused, numpy_path)
        assert fused[1].shape == (rows, 3)
    for n_targets in (1, 2):
        attrs = _forest(MODES[1], "target", n_targets, TRACKS[2], np.random.default_rng(2))
        reg = _model(
            "TreeEnsembleRegressor",
            TensorProto.FLOAT,
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None, n_targets])],
            n_targets=n_targets,
            **attrs,
        )
        for rows in (0, 1):
            fused, numpy_path = _ours_both_paths(reg, _x(rows), monkeypatch)
            _close(fused, numpy_path)
            assert fused[0].shape == (rows, n_targets)
    # Many rows split over two threads (each row computed whole by one call): the same
    # results as the rows run alone and as the NumPy path.
    from onnxep.providers_cpu.ops import nn_cpu

    calls = []

    def counted(rows, work, fn):
        nn_cpu.parallel_rows(rows, work, lambda r0, r1: (calls.append((r0, r1)), fn(r0, r1)))

    monkeypatch.setattr(tree_eval, "_READ_COST", 1 << 24)
    monkeypatch.setattr(tree_eval, "parallel_rows", counted)
    so = onnxep.SessionOptions()
    so.intra_op_num_threads = 2
    sess = onnxep.InferenceSession(data, so, providers=["cpu"])
    x = _x(300)
    big = sess.run(None, {"X": x})
    assert len(calls) > 1 and sorted(calls)[0][0] == 0 and sorted(calls)[-1][1] == 300
    few = sess.run(None, {"X": x[:10]})
    _close([big[0][:10], big[1][:10]], few)
    with monkeypatch.context() as m:
        m.setattr(jit, "ENABLED", False)
        _close(big, sess.run(None, {"X": x}))


class _Node:
    """A TreeEnsembleRegressor node's attributes, as ``tree_eval.from_attributes`` reads them."""

    op_type = "TreeEnsembleRegressor"
    name = "n"

    def __init__(self, attrs):
        self.attrs = attrs

    def attr(self, name, default=None):
        return self.attrs.get(name, default)


def test_tree_depths_are_each_trees_own():
    """The compiled walk takes each tree only as deep as it goes: a stump one step, the
    deeper trees two, a lone leaf none."""
    from onnxep.providers_cpu.ops import tree_loops

    attrs = _forest(MODES[0], "target", 1, TRACKS[0], np.random.default_rng(4))
    f = tree_eval.from_attributes(_Node(attrs), "target", np.float32, 1)
    assert tree_loops.tree_depths(f).tolist() == [2, 2, 1]
    leaf = {k: v for k, v in attrs.items()}
    leaf.update(nodes_treeids=[0], nodes_nodeids=[0], nodes_featureids=[0], nodes_modes=["LEAF"],
                nodes_values=[0.0], nodes_truenodeids=[0], nodes_falsenodeids=[0],
                nodes_missing_value_tracks_true=[0], target_treeids=[0], target_nodeids=[0],
                target_ids=[0], target_weights=[1.5])  # fmt: skip
    f = tree_eval.from_attributes(_Node(leaf), "target", np.float32, 1)
    assert tree_loops.tree_depths(f).tolist() == [0]


def test_fused_run_is_taken_and_refused_where_it_must_be():
    """Classifiers of more than two classes and regressors without EQ/NEQ/MEMBER nodes get the
    compiled run; an ensemble with BRANCH_EQ keeps the NumPy path."""
    from onnxep.providers_cpu.ops import ml_common

    attrs = _forest(MODES[0], "target", 2, TRACKS[0], np.random.default_rng(1))
    f = tree_eval.from_attributes(_Node(attrs), "target", np.float32, 2)
    assert f.fused(tree_eval.REGRESS, ml_common.NONE, np.zeros(0)) is not None
    attrs["nodes_modes"] = ["BRANCH_EQ" if m == "BRANCH_LEQ" else m for m in attrs["nodes_modes"]]
    f = tree_eval.from_attributes(_Node(attrs), "target", np.float32, 2)
    assert f.fused(tree_eval.REGRESS, ml_common.NONE, np.zeros(0)) is None


def test_narrow_input_is_refused_with_the_same_sentence(monkeypatch):
    data = _classifier(width=None)
    x = _x(3)[:, :1]
    sess = onnxep.InferenceSession(data, providers=["cpu"])
    with pytest.raises(Exception, match="features per row") as fused:
        sess.run(None, {"X": x})
    monkeypatch.setattr(jit, "ENABLED", False)
    with pytest.raises(Exception, match="features per row") as numpy_path:
        sess.run(None, {"X": x})
    assert str(fused.value) == str(numpy_path.value)


@pytest.mark.parametrize("kind", ["gb3", "rf3", "gb2", "rf2", "rf_reg2", "gb_reg"])
def test_sklearn_ensembles(kind, monkeypatch):
    """Converted scikit-learn ensembles: boosted (one weight a leaf, SOFTMAX) and random
    forests (a weight per class on each leaf; several regression targets)."""
    skl = pytest.importorskip("sklearn.ensemble")
    skl2onnx = pytest.importorskip("skl2onnx")
    from skl2onnx.common.data_types import FloatTensorType

    rng = np.random.default_rng(8)
    x = rng.standard_normal((200, 6)).astype(np.float32)
    cls = (x[:, 0] > 0).astype(int) + (x[:, 2] > 0.5) + (x[:, 4] < -1)
    est = {
        "gb3": lambda: skl.GradientBoostingClassifier(n_estimators=10, max_depth=3).fit(x, cls),
        "rf3": lambda: skl.RandomForestClassifier(n_estimators=8, max_depth=4).fit(x, cls),
        "gb2": lambda: skl.GradientBoostingClassifier(n_estimators=10, max_depth=3).fit(x, cls > 0),
        "rf2": lambda: skl.RandomForestClassifier(n_estimators=8, max_depth=4).fit(x, cls > 0),
        "rf_reg2": lambda: skl.RandomForestRegressor(n_estimators=6, max_depth=4).fit(
            x, np.stack([x[:, 0] * 2, x[:, 1] - x[:, 3]], axis=1)
        ),
        "gb_reg": lambda: skl.GradientBoostingRegressor(n_estimators=12, max_depth=3).fit(
            x, x[:, 0] * x[:, 1]
        ),
    }[kind]()
    opts = {"zipmap": False} if kind in ("gb3", "rf3", "gb2", "rf2") else None
    model = skl2onnx.convert_sklearn(
        est, initial_types=[("X", FloatTensorType([None, 6]))],
        target_opset={"": 17, "ai.onnx.ml": 3}, options={id(est): opts} if opts else None,
    )  # fmt: skip
    data = model.SerializeToString()
    feed = x[:9].copy()
    feed[0, 1] = np.nan
    feed[1, :] = np.inf
    fused, numpy_path = _ours_both_paths(data, feed, monkeypatch)
    _close(fused, numpy_path)
    _parity(fused, _theirs(data, feed))
