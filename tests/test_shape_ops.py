"""Tensor manipulation and indexing kernels on cases the ONNX node suite leaves out.

Old attribute-style opsets (Reshape-1, Slice-1, Split-2, Pad-2, TopK-1...),
edge clamping, strings, narrow dtypes, reductions with duplicate indices and
the seeded training Dropout.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

import onnxep
from onnxep.providers.dtypes import elem_type
from onnxep.providers.ops import shape as _shape

BF16 = np.dtype(ml_dtypes.bfloat16)


def run_node(op, inputs, attrs=None, opset=21, outs=1, out_dtypes=None, consts=None):
    """Run a one-node model and return all outputs.

    ``inputs`` is a list of arrays (``None`` leaves an optional input out);
    ``consts`` maps input positions to initializers instead of feeds.
    """
    consts = consts or {}
    names, feeds, g_in, inits = [], {}, [], []
    for i, a in enumerate(inputs):
        if a is None:
            names.append("")
            continue
        n = f"x{i}"
        names.append(n)
        if i in consts:
            inits.append(helper.make_tensor(n, elem_type(a.dtype), a.shape, a.reshape(-1).tolist()))
        else:
            feeds[n] = a
            g_in.append(helper.make_tensor_value_info(n, elem_type(a.dtype), list(a.shape)))
    out_names = [f"y{j}" for j in range(outs)]
    node = helper.make_node(op, names, out_names, **(attrs or {}))
    if out_dtypes is None:
        out_dtypes = [inputs[0].dtype if inputs else np.float32] * outs
    g_out = [
        helper.make_tensor_value_info(n, elem_type(dt), None)
        for n, dt in zip(out_names, out_dtypes)
    ]
    graph = helper.make_graph([node], "g", g_in, g_out, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10 if opset >= 21 else 8
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    return sess.run(None, feeds)


X = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
I64 = np.int64


def test_reshape_v1_attr_and_zero_copy():
    (y,) = run_node("Reshape", [X], {"shape": [0, -1]}, opset=1)
    assert y.shape == (2, 12)


def test_reshape_allowzero():
    (y,) = run_node(
        "Reshape", [np.zeros((0, 3), np.float32), np.array([3, 0], I64)], {"allowzero": 1}
    )
    assert y.shape == (3, 0)


@pytest.mark.parametrize("opset", [1, 11])
def test_squeeze_unsqueeze_attr(opset):
    x = np.zeros((1, 3, 1), np.float32)
    (y,) = run_node("Squeeze", [x], {"axes": [0]}, opset=opset)
    assert y.shape == (3, 1)
    (y,) = run_node("Squeeze", [x], opset=opset)
    assert y.shape == (3,)
    axes = [0, 4] if opset == 1 else [0, -1]
    (y,) = run_node("Unsqueeze", [x], {"axes": axes}, opset=opset)
    assert y.shape == (1, 1, 3, 1, 1)


def test_split_attr_and_legacy_input():
    x = np.arange(6, dtype=np.float32)
    a, b = run_node("Split", [x], {"split": [2, 4]}, opset=2, outs=2)
    np.testing.assert_array_equal(b, x[2:])
    a, b, c = run_node("Split", [x], {}, opset=11, outs=3)
    np.testing.assert_array_equal(c, x[4:])
    a, b = run_node("Split", [x, np.array([5, 1], I64)], {}, opset=1, outs=2)
    np.testing.assert_array_equal(a, x[:5])


def test_split_num_outputs_uneven():
    x = np.arange(7, dtype=np.float32)
    parts = run_node("Split", [x], {"num_outputs": 3}, opset=18, outs=3)
    assert [p.tolist() for p in parts] == [[0, 1, 2], [3, 4, 5], [6]]


def test_slice_v1_attrs():
    (y,) = run_node("Slice", [X], {"starts": [1, -2], "ends": [100, 1000], "axes": [1, 2]}, opset=1)
    np.testing.assert_array_equal(y, X[:, 1:, -2:])


def test_slice_negative_step_far_negative_start_clamps_to_zero():
    x = np.arange(5, dtype=np.float32)
    args = [x, np.array([-100], I64), np.array([-1000], I64), np.array([0], I64)]
    (y,) = run_node("Slice", [*args, np.array([-1], I64)], opset=13)
    np.testing.assert_array_equal(y, x[:1])
    (y,) = run_node("Slice", [x, *(np.array([v], I64) for v in (10, -10, 0, -2))], opset=13)
    np.testing.assert_array_equal(y, x[::-2])


@pytest.mark.parametrize(
    ("opset", "attrs"),
    [
        (1, {"paddings": [0, 1, 0, 2], "mode": "reflect"}),
        (2, {"pads": [0, 1, 0, 2], "mode": "reflect"}),
    ],
)
def test_pad_attr_forms(opset, attrs):
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    (y,) = run_node("Pad", [x], attrs, opset=opset)
    np.testing.assert_array_equal(y, np.pad(x, ((0, 0), (1, 2)), mode="reflect"))


def test_pad_negative_crops_and_wrap():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    (y,) = run_node("Pad", [x, np.array([-1, 2, 0, -1], I64)], {"mode": "wrap"}, opset=19)
    np.testing.assert_array_equal(y, np.pad(x[1:, :3], ((0, 0), (2, 0)), mode="wrap"))


def test_pad_strings_constant():
    x = np.array([["a", "b"]], dtype=object)
    (y,) = run_node("Pad", [x, np.array([0, 1, 0, 0], I64)], opset=18)
    assert y.tolist() == [["", "a", "b"]]


def test_concat_v1_default_axis():
    (y,) = run_node("Concat", [X, X], opset=1)
    assert y.shape == (2, 6, 4)


def test_tile_v1():
    (y,) = run_node("Tile", [X, np.array(2, I64), np.array(1, I64)], opset=1)
    np.testing.assert_array_equal(y, np.tile(X, (1, 2, 1)))


def test_topk_v1_attr_and_stable_ties():
    x = np.array([[3, 1, 3, 2, 3]], np.float32)
    v, i = run_node("TopK", [x], {"k": 3}, opset=1, outs=2, out_dtypes=[np.float32, I64])
    assert i.tolist() == [[0, 2, 4]]
    x = np.array([5, 1, 5, 1], np.uint64)
    v, i = run_node(
        "TopK", [x, np.array([3], I64)], {"largest": 0}, opset=11, outs=2, out_dtypes=[x.dtype, I64]
    )
    assert i.tolist() == [1, 3, 0] and v.tolist() == [1, 1, 5]


def test_argmax_select_last_index_bool():
    x = np.array([[True, False, True]])
    (y,) = run_node("ArgMax", [x], {"axis": 1, "select_last_index": 1}, opset=13, out_dtypes=[I64])
    assert y.tolist() == [[2]]


def test_gather_strings_negative():
    x = np.array(["a", "b", "c"], dtype=object)
    (y,) = run_node("Gather", [x, np.array([-1, 0], I64)], opset=13)
    assert y.tolist() == ["c", "a"]


def test_gathernd_batch_dims_negative_indices():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    idx = np.array([[[-1, 0]], [[0, -1]]], I64)
    (y,) = run_node("GatherND", [x, idx], {"batch_dims": 1}, opset=13)
    np.testing.assert_array_equal(y, np.array([[x[0, 2, 0]], [x[1, 0, 3]]]))


def test_scatternd_bfloat16_mul_duplicates():
    data = np.ones(4, BF16)
    idx = np.array([[1], [1], [3]], I64)
    upd = np.array([2, 3, 4], BF16)
    (y,) = run_node("ScatterND", [data, idx, upd], {"reduction": "mul"}, opset=18)
    assert y.astype(np.float32).tolist() == [1, 6, 1, 4]


class _NotNumpy:
    """NumPy without ``ufunc.at``, to exercise the scatter rounds path."""

    def __getattr__(self, name):
        if name in ("add", "multiply", "maximum", "minimum"):
            fn = getattr(np, name)
            return lambda *a, **k: fn(*a, **k)
        return getattr(np, name)


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
def test_scatter_rounds_match_ufunc_at(reduction):
    rng = np.random.default_rng(0)
    out = rng.integers(1, 5, size=(5, 3)).astype(np.float64)
    rows = rng.integers(0, 5, size=(8, 1))
    cols = np.arange(3).reshape(1, 3)
    upd = rng.integers(1, 5, size=(8, 3)).astype(np.float64)
    want = out.copy()
    ufunc = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}[reduction]
    ufunc.at(want, (np.broadcast_to(rows, (8, 3)), np.broadcast_to(cols, (8, 3))), upd)
    got = _shape.scatter(_NotNumpy(), out.copy(), (rows, cols), upd, reduction)
    np.testing.assert_array_equal(got, want)


def test_scatter_elements_keeps_constant_data():
    data = np.zeros((2, 2), np.float32)
    args = [data, np.array([[1], [0]], I64), np.array([[5], [6]], np.float32)]
    for _ in range(2):
        (y,) = run_node("ScatterElements", args, {"axis": 1}, opset=18, consts={0: 1})
        assert y.tolist() == [[0, 5], [6, 0]]


def test_tensor_scatter_circular_write_indices():
    past = np.zeros((2, 4, 1), np.float32)
    upd = np.array([[[1], [2]], [[3], [4]]], np.float32)
    wi = np.array([3, 1], I64)
    (y,) = run_node("TensorScatter", [past, upd, wi], {"axis": 1, "mode": "circular"}, opset=24)
    assert y[..., 0].tolist() == [[2, 0, 0, 1], [0, 3, 4, 0]]


@pytest.mark.parametrize(
    ("attr", "value", "expect"),
    [
        ("value_float", 1.5, np.array(1.5, np.float32)),
        ("value_floats", [1.0, 2.0], np.array([1, 2], np.float32)),
        ("value_int", 3, np.array(3, I64)),
        ("value_ints", [3, 4], np.array([3, 4], I64)),
        ("value_string", "hi", np.array("hi", dtype=object)),
        ("value_strings", ["a", "b"], np.array(["a", "b"], dtype=object)),
    ],
)
def test_constant_value_attrs(attr, value, expect):
    (y,) = run_node("Constant", [], {attr: value}, opset=13, out_dtypes=[expect.dtype])
    assert y.dtype == expect.dtype and y.tolist() == expect.tolist()


def test_constant_string_tensor():
    t = helper.make_tensor("v", TensorProto.STRING, [2], [b"x", b"yz"])
    (y,) = run_node("Constant", [], {"value": t}, opset=13, out_dtypes=[np.dtype(object)])
    assert y.tolist() == ["x", "yz"]


def test_dropout_training_seeded_matches_numpy_legacy_rng():
    x = np.ones((3, 4), np.float32)
    ratio, train = np.array(0.5, np.float32), np.array(True)
    y, m = run_node(
        "Dropout", [x, ratio, train], {"seed": 3}, opset=13, outs=2, out_dtypes=[x.dtype, bool]
    )
    np.random.seed(3)
    want = np.random.uniform(0, 1, x.shape) >= 0.5
    np.testing.assert_array_equal(m, want)
    np.testing.assert_array_equal(y, want * 2.0)


def test_dropout_v7_mask_of_ones():
    x = np.arange(3, dtype=np.float32)
    y, m = run_node("Dropout", [x], {"ratio": 0.3}, opset=7, outs=2)
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(m, np.ones(3))


def test_unique_unsorted_axis():
    x = np.array([[2, 2], [1, 1], [2, 2], [0, 5]], np.int32)
    y, idx, inv, cnt = run_node(
        "Unique", [x], {"axis": 0, "sorted": 0}, opset=11, outs=4, out_dtypes=[x.dtype] + [I64] * 3
    )
    assert y.tolist() == [[2, 2], [1, 1], [0, 5]]
    assert idx.tolist() == [0, 1, 3] and inv.tolist() == [0, 1, 0, 2] and cnt.tolist() == [2, 1, 1]


def test_range_integer_negative_delta_and_float16():
    (y,) = run_node("Range", [np.array(v, np.int32) for v in (10, 3, -3)], opset=11)
    assert y.tolist() == [10, 7, 4]
    (y,) = run_node("Range", [np.array(v, np.float16) for v in (0, 1, 0.25)], opset=27)
    assert y.dtype == np.float16 and y.tolist() == [0, 0.25, 0.5, 0.75]


def test_constant_of_shape_int_and_shape_slice():
    (y,) = run_node(
        "ConstantOfShape",
        [np.array([2, 3], I64)],
        {"value": helper.make_tensor("v", TensorProto.INT32, [1], [7])},
        opset=20,
        out_dtypes=[np.int32],
    )
    assert y.dtype == np.int32 and y.tolist() == [[7] * 3] * 2
    (s,) = run_node("Shape", [X], {"start": -2}, opset=15, out_dtypes=[I64])
    assert s.tolist() == [3, 4]


def test_onehot_float_indices_and_out_of_range():
    idx = np.array([1.7, -1.0, 5.0], np.float32)
    (y,) = run_node(
        "OneHot", [idx, np.array(3, I64), np.array([0, 9], I64)], opset=11, out_dtypes=[I64]
    )
    assert y.tolist() == [[0, 9, 0], [0, 0, 9], [0, 0, 0]]


def test_int4_transpose_and_concat():
    x = np.array([[1, -2], [3, -4]], dtype=ml_dtypes.int4)
    (y,) = run_node("Transpose", [x], opset=21)
    assert y.dtype == x.dtype and y.astype(int).tolist() == [[1, 3], [-2, -4]]


def test_gather_elements_indices_smaller_than_data():
    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    (y,) = run_node("GatherElements", [x, np.array([[2, -1]], I64)], {"axis": 0}, opset=13)
    assert y.tolist() == [[6, 7]]
