"""Ops that take indices refuse out-of-range ones (issue 8) and stay usable afterwards.

For each op: an in-range negative index reads (or writes) the right place,
the first index past either end (-d-1 and d) is refused with a RunError that
quotes it, and the same session then runs a valid feed again.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import onnxep
from onnxep.errors import RunError
from onnxep.providers.dtypes import elem_type
from onnxep.providers.ops import indices as _indices

I64 = np.int64
F32 = np.float32


def node_model(op, feeds, attrs=None, opset=18, domain="", out_dtype=F32):
    """A one-node model over ``feeds`` (name -> example array), serialized.

    Input dims are symbolic, so later runs may feed other shapes.
    """
    g_in = [
        helper.make_tensor_value_info(n, elem_type(a.dtype), [f"{n}{k}" for k in range(a.ndim)])
        for n, a in feeds.items()
    ]
    node = helper.make_node(op, list(feeds), ["y"], domain=domain, **(attrs or {}))
    out = helper.make_tensor_value_info("y", elem_type(np.dtype(out_dtype)), None)
    opsets = [helper.make_opsetid("", opset)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    model = helper.make_model(helper.make_graph([node], "g", g_in, [out]), opset_imports=opsets)
    model.ir_version = 10
    return model.SerializeToString()


def session(op, feeds, attrs=None, opset=18, domain="", out_dtype=F32):
    return onnxep.InferenceSession(
        node_model(op, feeds, attrs, opset, domain, out_dtype), providers=["cpu"]
    )


def refused(sess, feeds, *quoted):
    """Run ``feeds``, expecting a RunError whose message quotes each of ``quoted``."""
    with pytest.raises(RunError) as info:
        sess.run(None, feeds)
    msg = str(info.value)
    for q in quoted:
        assert q in msg, msg
    return msg


X = np.arange(12, dtype=F32).reshape(3, 4)  # d = 3 on axis 0, 4 on axis 1


@pytest.mark.parametrize(("axis", "d"), [(0, 3), (1, 4), (-1, 4)])
def test_gather(axis, d):
    feeds = {"x": X, "i": np.array([0, 0], I64)}
    sess = session("Gather", feeds, {"axis": axis}, opset=13)
    (y,) = sess.run(None, {"x": X, "i": np.array([-d, -1], I64)})
    np.testing.assert_array_equal(y, np.take(X, [0, d - 1], axis=axis))
    for bad in (-d - 1, d, -2 * d):
        refused(sess, {"x": X, "i": np.array([0, bad], I64)}, f"value {bad}", "at indices[1]")
    (y,) = sess.run(None, {"x": X, "i": np.array([1, 0], I64)})
    np.testing.assert_array_equal(y, np.take(X, [1, 0], axis=axis))


def test_gather_scalar_index_and_int32():
    sess = session("Gather", {"x": X, "i": np.array(0, np.int32)}, opset=13)
    (y,) = sess.run(None, {"x": X, "i": np.array(-3, np.int32)})
    np.testing.assert_array_equal(y, X[0])
    msg = refused(sess, {"x": X, "i": np.array(-4, np.int32)}, "value -4", "-3 to 2")
    assert "Gather" in msg and "axis 0 of size 3" in msg


def test_gather_names_the_node_on_every_run():
    # The first run goes through the checked loop, later runs through generated code.
    sess = session("Gather", {"x": X, "i": np.array([0], I64)}, opset=13)
    sess.run(None, {"x": X, "i": np.array([0], I64)})
    for _ in range(2):
        refused(sess, {"x": X, "i": np.array([3], I64)}, "Gather node", "value 3")


def test_gather_counts_every_offending_index():
    sess = session("Gather", {"x": X, "i": np.array([0, 0, 0], I64)}, opset=13)
    refused(sess, {"x": X, "i": np.array([5, 0, -9], I64)}, "value 5", "2 of 3 entries")


def test_gather_elements():
    idx = np.array([[0, 1, 2, 0]], I64)
    sess = session("GatherElements", {"x": X, "i": idx}, {"axis": 0}, opset=13)
    (y,) = sess.run(None, {"x": X, "i": np.array([[-3, -1, 0, 2]], I64)})
    assert y.tolist() == [[0, 9, 2, 11]]
    refused(sess, {"x": X, "i": np.array([[0, -4, 0, 0]], I64)}, "value -4", "at indices[0, 1]")
    refused(sess, {"x": X, "i": np.array([[0, 0, 0, 3]], I64)}, "value 3", "at indices[0, 3]")
    (y,) = sess.run(None, {"x": X, "i": idx})
    assert y.tolist() == [[0, 5, 10, 3]]


def test_gather_elements_refuses_indices_wider_than_data():
    sess = session("GatherElements", {"x": X, "i": np.zeros((1, 5), I64)}, {"axis": 0}, opset=13)
    refused(sess, {"x": X, "i": np.zeros((1, 5), I64)}, "on axis 1 (5 > 4)")


def test_gather_nd():
    sess = session("GatherND", {"x": X, "i": np.zeros((2, 2), I64)}, opset=13)
    (y,) = sess.run(None, {"x": X, "i": np.array([[-3, -4], [-1, 3]], I64)})
    assert y.tolist() == [0, 11]
    # each entry of a tuple is checked against its own axis
    msg = refused(sess, {"x": X, "i": np.array([[0, 0], [0, 4]], I64)}, "value 4", "[1, 1]")
    assert "axis 1 of size 4" in msg
    msg = refused(sess, {"x": X, "i": np.array([[-4, 0], [0, 0]], I64)}, "value -4", "[0, 0]")
    assert "axis 0 of size 3" in msg
    (y,) = sess.run(None, {"x": X, "i": np.array([[1, 1]] * 2, I64)})
    assert y.tolist() == [5, 5]


def test_gather_nd_batch_dims_checks_the_axes_after_the_batch():
    x = np.arange(24, dtype=F32).reshape(2, 3, 4)
    sess = session("GatherND", {"x": x, "i": np.zeros((2, 1), I64)}, {"batch_dims": 1}, opset=13)
    (y,) = sess.run(None, {"x": x, "i": np.array([[-3], [2]], I64)})
    np.testing.assert_array_equal(y, np.stack([x[0, 0], x[1, 2]]))
    msg = refused(sess, {"x": x, "i": np.array([[0], [-4]], I64)}, "value -4", "[1, 0]")
    assert "axis 1 of size 3" in msg


def test_gather_nd_refuses_tuples_longer_than_the_rank():
    sess = session("GatherND", {"x": X, "i": np.zeros((1, 3), I64)}, opset=13)
    refused(sess, {"x": X, "i": np.zeros((1, 3), I64)}, "length 3", "at most 2")


UPD = np.full((1, 4), 100, F32)


@pytest.mark.parametrize(
    ("op", "opset", "reduction"),
    [
        ("Scatter", 10, None),
        ("ScatterElements", 11, None),
        ("ScatterElements", 18, "none"),
        ("ScatterElements", 18, "add"),
        ("ScatterElements", 18, "mul"),
        ("ScatterElements", 18, "max"),
        ("ScatterElements", 18, "min"),
    ],
)
def test_scatter_elements(op, opset, reduction):
    attrs = {"axis": 0} if reduction is None else {"axis": 0, "reduction": reduction}
    feeds = {"x": X, "i": np.zeros((1, 4), I64), "u": UPD}
    sess = session(op, feeds, attrs, opset=opset)
    (y,) = sess.run(None, {**feeds, "i": np.array([[-3, -1, 0, 2]], I64)})
    rows = np.array([0, 2, 0, 2])
    touched = X[rows, np.arange(4)]
    combine = {
        None: lambda a, b: b,
        "none": lambda a, b: b,
        "add": np.add,
        "mul": np.multiply,
        "max": np.maximum,
        "min": np.minimum,
    }[reduction]
    want = X.copy()
    want[rows, np.arange(4)] = combine(touched, UPD[0])
    np.testing.assert_array_equal(y, want)
    for bad, col in ((-4, 1), (3, 2)):
        i = np.zeros((1, 4), I64)
        i[0, col] = bad
        refused(sess, {**feeds, "i": i}, f"value {bad}", f"at indices[0, {col}]", "-3 to 2")
    (y,) = sess.run(None, feeds)
    assert y[0].tolist() == combine(X[0], UPD[0]).tolist()


def test_scatter_elements_refuses_updates_of_another_shape():
    feeds = {"x": X, "i": np.zeros((1, 4), I64), "u": np.ones((1, 3), F32)}
    sess = session("ScatterElements", feeds, opset=18)
    refused(sess, feeds, "updates shape [1, 3]", "indices shape [1, 4]")


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd(reduction):
    upd = np.array([100, 200], F32)
    feeds = {"x": X, "i": np.zeros((2, 2), I64), "u": upd}
    sess = session("ScatterND", feeds, {"reduction": reduction}, opset=18)
    (y,) = sess.run(None, {**feeds, "i": np.array([[-3, -4], [-1, 3]], I64)})
    want = X.copy()
    combine = {
        "none": lambda a, b: b,
        "add": np.add,
        "mul": np.multiply,
        "max": np.maximum,
        "min": np.minimum,
    }[reduction]
    want[0, 0] = combine(X[0, 0], upd[0])
    want[2, 3] = combine(X[2, 3], upd[1])
    np.testing.assert_array_equal(y, want)
    refused(sess, {**feeds, "i": np.array([[0, 0], [-4, 1]], I64)}, "value -4", "[1, 0]")
    refused(sess, {**feeds, "i": np.array([[0, 4], [1, 1]], I64)}, "value 4", "[0, 1]")
    (y,) = sess.run(None, {**feeds, "i": np.array([[0, 0], [1, 1]], I64)})
    assert y[1, 1] == combine(X[1, 1], upd[1])


def test_scatter_nd_slices_and_shape_check():
    upd = np.full((1, 4), 7, F32)
    feeds = {"x": X, "i": np.array([[0]], I64), "u": upd}
    sess = session("ScatterND", feeds, opset=18)
    (y,) = sess.run(None, {**feeds, "i": np.array([[-1]], I64)})
    assert y[2].tolist() == [7] * 4 and y[:2].tolist() == X[:2].tolist()
    refused(sess, {**feeds, "i": np.array([[-4]], I64)}, "value -4", "axis 0 of size 3")
    refused(sess, {**feeds, "u": np.ones((1, 3), F32)}, "updates shape [1, 3]", "[1, 4]")


def _gbq_feeds(idx):
    # 4 rows of 32 int4 values, packed two per byte; zero point 8, scale 1
    data = np.arange(4 * 16, dtype=np.uint8).reshape(4, 16)
    return {"d": data, "i": np.asarray(idx, np.int32), "s": np.ones((4, 1), F32)}


def test_gather_block_quantized_zeroes_out_of_range_slices():
    # The com.microsoft schema: "Unlike ONNX Gather, an out-of-range index produces
    # zeros for the corresponding output slice" - so no error here, by design.
    attrs = {"block_size": 32, "bits": 4, "gather_axis": 0, "quantize_axis": 1}
    model = node_model(
        "GatherBlockQuantized", _gbq_feeds([0]), attrs, domain="com.microsoft", opset=21
    )
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    (rows,) = sess.run(None, _gbq_feeds([0, 3]))
    assert np.abs(rows).sum(axis=1).min() > 0  # every real row has a nonzero value
    (neg,) = sess.run(None, _gbq_feeds([-4, -1]))
    np.testing.assert_array_equal(neg, rows)
    (y,) = sess.run(None, _gbq_feeds([-5, 3, 4, -4, 99]))
    zero = np.zeros_like(rows[0])
    np.testing.assert_array_equal(y, np.stack([zero, rows[1], zero, rows[0], zero]))
    ort = pytest.importorskip("onnxruntime")
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(
        None, _gbq_feeds([-5, 3, 4, -4, 99])
    )[0]
    np.testing.assert_array_equal(y, want)


POOLED = np.array([[[[1, 2], [3, 4]]]], F32)
UNPOOL = {"kernel_shape": [2, 2], "strides": [2, 2]}


def test_max_unpool():
    idx = np.array([[[[0, 3], [12, 15]]]], I64)
    sess = session("MaxUnpool", {"x": POOLED, "i": idx}, UNPOOL, opset=11)
    for bad in (16, -1):
        i = idx.copy()
        i[0, 0, 1, 0] = bad
        refused(sess, {"x": POOLED, "i": i}, f"value {bad}", "I[0, 0, 1, 0]", "0 to 15")
    (y,) = sess.run(None, {"x": POOLED, "i": idx})
    assert y.reshape(-1)[[0, 3, 12, 15]].tolist() == [1, 2, 3, 4] and y.sum() == 10


def test_max_unpool_output_shape_grows_but_never_trims():
    idx = np.array([[[[0, 3], [12, 15]]]], I64)
    feeds = {"x": POOLED, "i": idx, "s": np.array([1, 1, 5, 5], I64)}
    sess = session("MaxUnpool", feeds, UNPOOL, opset=11)
    (y,) = sess.run(None, feeds)
    assert y.shape == (1, 1, 5, 5) and y[0, 0, 3, 3] == 4 and y.sum() == 10
    # indices address the unpooled 4x4 shape, not the requested 5x5 one
    refused(sess, {**feeds, "i": idx + 4}, "value 16", "0 to 15")
    # a smaller output_shape would drop unpooled values: refused, naming both shapes
    refused(sess, {**feeds, "s": np.array([1, 1, 3, 3], I64)}, "[1, 1, 3, 3]", "[4, 4]")


@pytest.mark.parametrize("axis", [None, 0])
def test_compress(axis):
    attrs = {} if axis is None else {"axis": axis}
    n = X.size if axis is None else X.shape[0]
    sess = session("Compress", {"x": X, "c": np.zeros(n, bool)}, attrs, opset=11)
    # shorter, and longer with False past the end, both select from the start
    (y,) = sess.run(None, {"x": X, "c": np.array([1, 0, 1], bool)})
    np.testing.assert_array_equal(y, np.compress([1, 0, 1], X, axis=axis))
    (y,) = sess.run(None, {"x": X, "c": np.r_[np.ones(n, bool), False, False]})
    np.testing.assert_array_equal(y, X.reshape(-1) if axis is None else X)
    c = np.r_[np.ones(n, bool), False, True]
    refused(sess, {"x": X, "c": c}, f"True at position {n + 1}", f"only {n} entries")
    (y,) = sess.run(None, {"x": X, "c": np.array([0, 1], bool)})
    np.testing.assert_array_equal(y, np.compress([0, 1], X, axis=axis))


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter(mode):
    past = np.zeros((2, 4, 1), F32)
    upd = np.ones((2, 2, 1), F32)
    feeds = {"p": past, "u": upd, "w": np.array([0, 2], I64)}
    sess = session("TensorScatter", feeds, {"axis": 1, "mode": mode}, opset=24)
    refused(sess, {**feeds, "w": np.array([-1, 0], I64)}, "value -1", "write_indices[0]")
    if mode == "linear":
        # two rows from position 3 would run past the end of a 4-long cache
        refused(sess, {**feeds, "w": np.array([0, 3], I64)}, "value 3", "0 to 2")
    else:
        (y,) = sess.run(None, {**feeds, "w": np.array([0, 7], I64)})
        assert y[1, :, 0].tolist() == [1, 0, 0, 1]
    (y,) = sess.run(None, feeds)
    assert y[:, :, 0].tolist() == [[1, 1, 0, 0], [0, 0, 1, 1]]


def test_tensor_scatter_refuses_an_update_longer_than_the_cache():
    feeds = {"p": np.zeros((1, 2, 1), F32), "u": np.ones((1, 3, 1), F32)}
    sess = session("TensorScatter", feeds, {"axis": 1}, opset=24)
    refused(sess, feeds, "3 rows", "holds only 2")


def test_one_hot_out_of_range_is_all_off_as_specified():
    # OneHot is the exception: the spec (and onnxruntime) turn an index outside
    # [-depth, depth-1] into an all-off row instead of an error.
    feeds = {"i": np.array([-4, -3, -1, 2, 3, 9], I64), "d": np.array(3, I64)}
    feeds["v"] = np.array([5, 7], F32)
    sess = session("OneHot", feeds, opset=11)
    (y,) = sess.run(None, feeds)
    assert y.tolist() == [
        [5, 5, 5],
        [7, 5, 5],
        [5, 5, 7],
        [5, 5, 7],
        [5, 5, 5],
        [5, 5, 5],
    ]
    refused(sess, {**feeds, "d": np.array(-2, I64)}, "depth -2")
    refused(sess, {**feeds, "v": np.array([5, 7, 9], F32)}, "exactly two", "[3]")
    assert sess.run(None, feeds)[0].shape == (6, 3)


# --- the helper itself, beyond NumPy


class _Stream:
    def __init__(self, capturing):
        self.capturing = capturing

    def is_capturing(self):
        return self.capturing


class _CapturingNamespace:
    """NumPy dressed as a device namespace whose current stream is (or is not) capturing."""

    def __init__(self, capturing):
        stream = _Stream(capturing)
        self.cuda = type("cuda", (), {"get_current_stream": staticmethod(lambda: stream)})

    def __getattr__(self, name):
        return getattr(np, name)


class _DeviceArray(np.ndarray):
    """An array the helper cannot recognise as host memory, so it takes the device path."""


def _device(values):
    return np.asarray(values, I64).view(_DeviceArray)


def test_device_path_checks_with_one_reduction_and_normalises():
    xp = _CapturingNamespace(capturing=False)
    idx = _indices.checked_indices(xp, _device([-3, 2]), 3, "Gather", axis=0)
    assert np.asarray(idx).tolist() == [0, 2]
    with pytest.raises(IndexError, match=r"value -4 at indices\[1\]"):
        _indices.checked_indices(xp, _device([0, -4]), 3, "Gather", axis=0)
    tuples = _device([[0, -1], [2, 3]])
    got = _indices.checked_index_tuples(xp, tuples, (3, 4), "GatherND")
    assert np.asarray(got).tolist() == [[0, 3], [2, 3]]
    with pytest.raises(IndexError, match=r"value 4 at indices\[1, 1\].*axis 1 of size 4"):
        _indices.checked_index_tuples(xp, _device([[0, 0], [2, 4]]), (3, 4), "GatherND")


def test_device_path_refuses_to_be_captured():
    # A CUDA graph cannot contain a device-to-host read, and an unchecked replay could read out
    # of bounds: the capture fails, so the captured runner makes the step an eager seam.
    xp = _CapturingNamespace(capturing=True)
    for idx in ([-1, 2], [-1, 7]):
        with pytest.raises(RuntimeError, match="CUDA graph capture cannot hold"):
            _indices.checked_indices(xp, _device(idx), 3, "Gather")
    with pytest.raises(RuntimeError, match="CUDA graph capture cannot hold"):
        _indices.checked_index_tuples(xp, _device([[0, 1]]), (3, 4), "GatherND")


def test_torch_namespace_takes_the_device_path():
    torch = pytest.importorskip("torch")
    xp = pytest.importorskip("array_api_compat.torch")
    idx = _indices.checked_indices(xp, torch.tensor([-2, 1]), 2, "Gather")
    assert idx.tolist() == [0, 1]
    with pytest.raises(IndexError, match="value 2"):
        _indices.checked_indices(xp, torch.tensor([0, 2]), 2, "Gather")


# --- other ops that read by index


def test_roi_align_batch_indices():
    x = np.stack([np.full((1, 4, 4), 1, F32), np.full((1, 4, 4), 2, F32)])
    feeds = {"x": x, "r": np.array([[0, 0, 2, 2]], F32), "b": np.array([1], I64)}
    sess = session("RoiAlign", feeds, {"output_height": 1, "output_width": 1}, opset=16)
    for bad in (-1, 2):
        refused(sess, {**feeds, "b": np.array([bad], I64)}, f"value {bad}", "2 images", "0 to 1")
    assert sess.run(None, feeds)[0].reshape(-1).tolist() == [2]


COS = np.cos(np.arange(6, dtype=F32)).reshape(3, 2)
SIN = np.sin(np.arange(6, dtype=F32)).reshape(3, 2)


def test_rotary_embedding_position_ids():
    x = np.ones((1, 1, 2, 4), F32)
    feeds = {"x": x, "c": COS, "s": SIN, "p": np.array([[0, 2]], I64)}
    sess = session("RotaryEmbedding", feeds, opset=23)
    (want,) = sess.run(None, feeds)
    # -1 used to read the cache's last row; position ids are never counted from the end
    refused(sess, {**feeds, "p": np.array([[0, -1]], I64)}, "position -1 (position_ids[0, 1])",
            "is negative")  # fmt: skip
    refused(sess, {**feeds, "p": np.array([[3, 0]], I64)}, "position 3 (position_ids[0, 0])",
            "past the rotary cache's 3 rows")  # fmt: skip
    np.testing.assert_array_equal(sess.run(None, feeds)[0], want)


def test_rotary_embedding_contrib_position_ids():
    x = np.ones((1, 2, 4), F32)
    feeds = {"x": x, "p": np.array([[0, 2]], I64), "c": COS, "s": SIN}
    sess = session("RotaryEmbedding", feeds, {"num_heads": 1}, domain="com.microsoft", opset=21)
    (want,) = sess.run(None, feeds)
    refused(sess, {**feeds, "p": np.array([[-1, 0]], I64)}, "position -1 (position_ids[0, 0])")
    np.testing.assert_array_equal(sess.run(None, feeds)[0], want)
    # a start offset: 2 means positions 2 and 3 for a sequence of two
    start = {**feeds, "p": np.array([2], I64)}
    sess = session("RotaryEmbedding", start, {"num_heads": 1}, domain="com.microsoft", opset=21)
    refused(sess, start, "position 3 (position_ids[0] + 1)", "past the rotary cache's 3 rows")


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
def test_loss_targets_name_a_class_or_the_ignored_one(op):
    x = np.log(np.array([[0.2, 0.3, 0.5], [0.1, 0.1, 0.8]], F32))
    feeds = {"x": x, "t": np.array([2, 0], I64)}
    sess = session(op, feeds, {"reduction": "none", "ignore_index": -100}, opset=13)
    (ok,) = sess.run(None, feeds)
    # targets used to be clipped into [0, C): 3 read class 2, -1 read class 0
    for bad in (3, -1):
        refused(sess, {**feeds, "t": np.array([0, bad], I64)}, f"target value {bad}", "3 classes")
    (ignored,) = sess.run(None, {**feeds, "t": np.array([2, -100], I64)})
    assert ignored[1] == 0 and ignored[0] == ok[0]


def test_reverse_sequence_lengths():
    x = np.arange(6, dtype=F32).reshape(3, 2)
    feeds = {"x": x, "l": np.array([0, 3], I64)}
    sess = session("ReverseSequence", feeds, {"time_axis": 0, "batch_axis": 1}, opset=10)
    for bad in (4, -1):
        refused(
            sess,
            {**feeds, "l": np.array([1, bad], I64)},
            f"value {bad} at sequence_lens[1]",
            "0 to 3",
        )
    assert sess.run(None, feeds)[0].tolist() == [[0, 5], [2, 3], [4, 1]]
