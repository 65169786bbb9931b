"""Index ops against onnx.reference over random shapes, axes, dtypes and indices.

Each example builds a one-node model. With every index in range, onnxep's
output must equal the reference's exactly; with one index pushed out of
range, onnxep must raise a RunError quoting it (the reference may or may not
raise, so it is not consulted). Scatters with ``reduction="none"`` get unique
indices, since the order duplicates are written in is undefined.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import helper
from onnx.reference import ReferenceEvaluator

import onnxep
from onnxep.errors import RunError
from onnxep.providers.dtypes import elem_type

SETTINGS = settings(
    max_examples=75,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
DTYPES = st.sampled_from([np.dtype(np.float32), np.dtype(np.int64)])
REDUCTIONS = st.sampled_from(["none", "add", "mul", "max", "min"])
shapes = st.lists(st.integers(1, 4), min_size=1, max_size=4).map(tuple)


def model(op, feeds, attrs, opset, out_dtype):
    g_in = [
        helper.make_tensor_value_info(n, elem_type(a.dtype), list(a.shape))
        for n, a in feeds.items()
    ]
    node = helper.make_node(op, list(feeds), ["y"], **attrs)
    out = helper.make_tensor_value_info("y", elem_type(np.dtype(out_dtype)), None)
    graph = helper.make_graph([node], "g", g_in, [out])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def check(op, feeds, attrs, bad=None, opset=18, out_dtype=None, ref_attrs=None):
    """onnxep equals the reference, or, when ``bad`` is an injected index, refuses it.

    ``ref_attrs`` replaces ``attrs`` for the reference, where it mishandles a form.
    """
    out_dtype = next(iter(feeds.values())).dtype if out_dtype is None else out_dtype
    m = model(op, feeds, attrs, opset, out_dtype)
    sess = onnxep.InferenceSession(m.SerializeToString(), providers=["cpu"])
    event("compared with the reference" if bad is None else "one index pushed out of range")
    if bad is not None:
        with pytest.raises(RunError, match=rf"value {bad} at "):
            sess.run(None, feeds)
        return
    (got,) = sess.run(None, feeds)
    ref = m if ref_attrs is None else model(op, feeds, ref_attrs, opset, out_dtype)
    (want,) = ReferenceEvaluator(ref).run(None, feeds)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def data_of(shape, dtype):
    """Distinct values, so reading the wrong element always shows."""
    return (np.arange(math.prod(shape)) - 7).reshape(shape).astype(dtype)


def small_values(shape, dtype, seed):
    """Small integers (as ``dtype``): sums and products of a few stay exact in float32."""
    return np.random.default_rng(seed).integers(-4, 5, size=shape).astype(dtype)


def in_range(dim):
    return st.integers(-dim, dim - 1)


def out_of_range(dim):
    """The first index past either end, far beyond it, and the old -2d blind spot."""
    return st.one_of(
        st.sampled_from([-dim - 1, dim, -2 * dim]), st.integers(-4 * dim - 9, -dim - 1)
    ) | st.integers(dim, 4 * dim + 9)


@st.composite
def maybe_spoil(draw, idx, dims):
    """``idx`` as is, or with one entry moved out of range; returns (indices, bad value).

    ``dims`` is the axis length for every entry, or a tuple of lengths along
    the last axis (the index tuples of GatherND and ScatterND).
    """
    if idx.size == 0 or not draw(st.booleans()):
        return idx, None
    pos = np.unravel_index(draw(st.integers(0, idx.size - 1)), idx.shape)
    dim = dims if isinstance(dims, int) else dims[pos[-1]]
    bad = draw(out_of_range(dim))
    spoiled = idx.copy()
    spoiled[pos] = bad
    return spoiled, bad


@st.composite
def gather_cases(draw):
    shape, dtype = draw(shapes), draw(DTYPES)
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    d = shape[axis]
    ishape = draw(st.lists(st.integers(1, 3), max_size=2).map(tuple))
    idx = draw(hnp.arrays(np.int64, ishape, elements=in_range(d)))
    idx, bad = draw(maybe_spoil(idx, d))
    return {"x": data_of(shape, dtype), "i": idx}, {"axis": axis}, bad


@st.composite
def gather_elements_cases(draw):
    shape, dtype = draw(shapes), draw(DTYPES)
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    a = axis % len(shape)
    # the reference wants data's sizes off the axis (onnxep also takes smaller ones)
    ishape = tuple(draw(st.integers(1, 4)) if k == a else n for k, n in enumerate(shape))
    idx = draw(hnp.arrays(np.int64, ishape, elements=in_range(shape[a])))
    idx, bad = draw(maybe_spoil(idx, shape[a]))
    return {"x": data_of(shape, dtype), "i": idx}, {"axis": axis}, bad, a


def index_tuples(draw, lead, dims):
    """Indices of shape ``lead + (len(dims),)``, column ``i`` within ``dims[i]``."""
    cols = [draw(hnp.arrays(np.int64, lead, elements=in_range(n))) for n in dims]
    return np.stack(cols, axis=-1) if cols else np.zeros((*lead, 0), np.int64)


@st.composite
def gather_nd_cases(draw):
    shape, dtype = draw(shapes), draw(DTYPES)
    r = len(shape)
    b = draw(st.integers(0, r - 1))
    k = draw(st.integers(1, r - b))
    extra = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    idx = index_tuples(draw, shape[:b] + extra, shape[b : b + k])
    idx, bad = draw(maybe_spoil(idx, shape[b : b + k]))
    return {"x": data_of(shape, dtype), "i": idx}, {"batch_dims": b}, bad


@st.composite
def scatter_elements_cases(draw):
    shape, dtype, reduction = draw(shapes), draw(DTYPES), draw(REDUCTIONS)
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    a = axis % len(shape)
    d = shape[a]
    ishape = tuple(draw(st.integers(1, n)) for n in shape)
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    if reduction == "none":
        # a distinct target row for every entry of each column along the axis
        moved = np.moveaxis(np.empty(ishape, np.int64), a, -1)
        cols = [rng.permutation(d)[: ishape[a]] for _ in range(moved[..., 0].size)]
        idx = np.moveaxis(np.reshape(cols, moved.shape), -1, a)
    else:
        idx = rng.integers(0, d, size=ishape)
    idx = np.where(rng.random(ishape) < 0.5, idx - d, idx).astype(np.int64)
    idx, bad = draw(maybe_spoil(idx, d))
    feeds = {
        "x": small_values(shape, dtype, seed + 1),
        "i": idx,
        "u": small_values(ishape, dtype, seed + 2),
    }
    return feeds, {"axis": axis, "reduction": reduction}, bad


@st.composite
def scatter_nd_cases(draw):
    shape, dtype, reduction = draw(shapes), draw(DTYPES), draw(REDUCTIONS)
    k = draw(st.integers(1, len(shape)))
    total = math.prod(shape[:k])
    n = draw(st.integers(1, min(6, total)))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    flat = rng.choice(total, n, replace=False) if reduction == "none" else rng.integers(0, total, n)
    idx = np.stack(np.unravel_index(flat, shape[:k]), axis=-1).astype(np.int64)
    idx = np.where(rng.random(idx.shape) < 0.5, idx - np.array(shape[:k]), idx)
    idx, bad = draw(maybe_spoil(idx, shape[:k]))
    feeds = {
        "x": small_values(shape, dtype, seed + 1),
        "i": idx,
        "u": small_values((n, *shape[k:]), dtype, seed + 2),
    }
    return feeds, {"reduction": reduction}, bad


@SETTINGS
@given(gather_cases())
def test_gather_matches_reference(case):
    feeds, attrs, bad = case
    check("Gather", feeds, attrs, bad)


@SETTINGS
@given(gather_elements_cases())
def test_gather_elements_matches_reference(case):
    feeds, attrs, bad, a = case
    # onnx.reference's GatherElements misreads a negative axis: it gets the axis as counted
    check("GatherElements", feeds, attrs, bad, ref_attrs={"axis": a})


@SETTINGS
@given(gather_nd_cases())
def test_gather_nd_matches_reference(case):
    feeds, attrs, bad = case
    check("GatherND", feeds, attrs, bad)


@SETTINGS
@given(scatter_elements_cases())
def test_scatter_elements_matches_reference(case):
    feeds, attrs, bad = case
    check("ScatterElements", feeds, attrs, bad)


@SETTINGS
@given(scatter_nd_cases())
def test_scatter_nd_matches_reference(case):
    feeds, attrs, bad = case
    check("ScatterND", feeds, attrs, bad)


@st.composite
def one_hot_cases(draw):
    ishape = tuple(draw(st.lists(st.integers(1, 3), max_size=3)))
    depth = draw(st.integers(1, 5))
    axis = draw(st.integers(-len(ishape) - 1, len(ishape)))
    # out-of-range indices included on purpose: the spec makes them all-off rows
    idx = draw(hnp.arrays(np.int64, ishape, elements=st.integers(-2 * depth - 2, 2 * depth + 2)))
    values = np.array([3, 8], draw(DTYPES))
    return {"i": idx, "d": np.array(depth, np.int64), "v": values}, {"axis": axis}


@SETTINGS
@given(one_hot_cases())
def test_one_hot_matches_reference_in_and_out_of_range(case):
    feeds, attrs = case
    check("OneHot", feeds, attrs, opset=11, out_dtype=feeds["v"].dtype)
