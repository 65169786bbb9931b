"""What a run pays besides its kernels, made cheaper (issue 23, session 9), and still right.

Feed checks remember the (dtype, shape) pairs that passed: a remembered pair skips the
checks, any other feed still meets them with the same sentence, before or after valid
runs. A feed dict of exactly the model's inputs skips the name checks. Slice with fed
bounds remembers its index per input shape and bounds; Where sizes a small select
without broadcast_shapes; Cast between NumPy's own types is astype; the executor enters
its one run context without an ExitStack and still leaves it when a kernel fails. The
NumPy recurrences (``ONNXEP_CPU_JIT=0``) end a zero-step sequence with zero states, as
onnxruntime and the compiled loops do.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.helper import np_dtype_to_tensor_dtype

import onnxep
from onnxep.errors import InvalidArgument, RunError
from onnxep.model_io import PASSED_KEYS
from onnxep.providers.ops.elementwise import cast_numeric
from onnxep.providers_cpu import jit, threads


def _model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _vi(name, dtype, shape):
    return helper.make_tensor_value_info(name, np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)


def _session(model, threads_=0):
    # the CPU's elementwise chains off: these tests time and inspect the unfused plan's steps
    so = onnxep.SessionOptions(
        intra_op_num_threads=threads_, disabled_rewrites=["fuse_elementwise_chains"]
    )
    return onnxep.InferenceSession(model.SerializeToString(), so, providers=["cpu"])


def _add_model():
    """y = x + b, x of shape [batch, 4] (batch free), b an initializer a feed may override."""
    b = numpy_helper.from_array(np.arange(4, dtype=np.float32), "b")
    return _model(
        [helper.make_node("Add", ["x", "b"], ["y"])],
        [_vi("x", np.float32, ["batch", 4]), _vi("b", np.float32, [4])],
        [_vi("y", np.float32, None)],
        [b],
    )


def _error(sess, feeds) -> str:
    with pytest.raises(InvalidArgument) as info:
        sess.run(None, feeds)
    return str(info.value)


# -- feed checks ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros((2, 4), np.float64),  # wrong dtype, a remembered shape
        np.zeros((2, 5), np.float32),  # the model fixes dim 1 to 4
        np.zeros((8,), np.float32),  # wrong rank, as many elements
        np.zeros((2, 4, 1), np.float32),
    ],
)
def test_remembered_feed_checks_still_reject_with_the_same_sentence(bad):
    fresh = _session(_add_model())
    want = _error(fresh, {"x": bad})
    sess = _session(_add_model())
    ok = np.ones((2, 4), np.float32)
    for _ in range(3):
        np.testing.assert_array_equal(sess.run(None, {"x": ok})[0], ok + np.arange(4))
    check = sess.compiled.feed_check("x")
    assert (ok.dtype, ok.shape) in check.passed
    assert _error(sess, {"x": bad}) == want
    assert (bad.dtype, bad.shape) not in check.passed
    # and a valid feed still passes afterwards
    np.testing.assert_array_equal(sess.run(None, {"x": ok})[0], ok + np.arange(4))


def test_feed_check_remembers_a_bounded_number_of_pairs():
    sess = _session(_add_model())
    check = sess.compiled.feed_check("x")
    for batch in range(1, PASSED_KEYS + 20):
        x = np.full((batch, 4), batch, np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x + np.arange(4))
    assert len(check.passed) == PASSED_KEYS
    # a pair past the bound is checked every time, and still passes
    x = np.ones((PASSED_KEYS + 30, 4), np.float32)
    assert sess.run(None, {"x": x})[0].shape == x.shape
    with pytest.raises(InvalidArgument, match="unknown input 'nope'"):
        sess.compiled.feed_check("nope")


def test_converted_feeds_are_checked_as_before():
    """Lists and NumPy scalars are converted, a non-C-ordered view passes as it is."""
    sess = _session(_add_model())
    want = np.ones((1, 4), np.float32) + np.arange(4)
    np.testing.assert_array_equal(sess.run(None, {"x": [[1.0, 1.0, 1.0, 1.0]]})[0], want)
    view = np.ones((5, 4), np.float32).T[:1]  # [1, 5]: the wrong fixed dim, as a view
    assert "at dim 1" in _error(sess, {"x": view})
    col = np.ones((4, 2), np.float32).T  # [2, 4], F-ordered
    np.testing.assert_array_equal(sess.run(None, {"x": col})[0], col + np.arange(4))


def test_exact_keys_and_other_feed_dicts_give_the_same_results_and_errors():
    sess = _session(_add_model())
    x = np.ones((3, 4), np.float32)
    b = np.full(4, 10, np.float32)
    base = x + np.arange(4)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], base)  # exact keys
    np.testing.assert_array_equal(sess.run(None, OrderedDict(x=x))[0], base)  # a subclass
    np.testing.assert_array_equal(sess.run(None, {"x": x, "b": b})[0], x + b)  # override
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], base)  # default again
    assert "unknown input(s) 'z'" in _error(sess, {"x": x, "z": x})
    assert "missing input 'x'" in _error(sess, {"b": b})
    assert "missing input 'x'" in _error(sess, {})
    with pytest.raises(InvalidArgument, match="must be a dict"):
        sess.run(None, [x])
    # every output list is the caller's own: changing one changes no later run
    out = sess.run(None, {"x": x})
    out.append("junk")
    assert len(sess.run(None, {"x": x})) == 1
    assert len(sess.run([], {"x": x})) == 1


# -- the run context ------------------------------------------------------------------------


def test_run_context_is_left_when_a_kernel_fails():
    """A failing run must leave the BLAS thread hold, or the next run of another count
    would wait forever."""
    model = _model(
        [
            helper.make_node("MatMul", ["a", "w"], ["m"]),
            helper.make_node("Reshape", ["m", "s"], ["y"]),
        ],
        [_vi("a", np.float32, [2, 3]), _vi("s", np.int64, [2])],
        [_vi("y", np.float32, None)],
        [numpy_helper.from_array(np.ones((3, 4), np.float32), "w")],
    )
    sess = _session(model, threads_=1)
    a = np.ones((2, 3), np.float32)
    good = {"a": a, "s": np.array([4, 2], np.int64)}
    np.testing.assert_array_equal(sess.run(None, good)[0], np.full((4, 2), 3, np.float32))
    before = threads.process_blas_threads()
    with pytest.raises(RunError):
        sess.run(None, {"a": a, "s": np.array([3, 3], np.int64)})
    assert threads._active == 0 and threads._applied is None  # noqa: SLF001
    assert threads.process_blas_threads() == before
    other = _session(model, threads_=2)  # another count: must not wait
    np.testing.assert_array_equal(other.run(None, good)[0], np.full((4, 2), 3, np.float32))
    assert threads._active == 0  # noqa: SLF001


# -- Slice with fed bounds --------------------------------------------------------------------


def _slice_model(bound_dtype):
    return _model(
        [helper.make_node("Slice", ["x", "starts", "ends", "axes", "steps"], ["y"])],
        [_vi("x", np.float32, None)]
        + [_vi(n, bound_dtype, [None]) for n in ("starts", "ends", "axes", "steps")],
        [_vi("y", np.float32, None)],
    )


@pytest.mark.parametrize("bound_dtype", [np.int64, np.int32])
def test_slice_index_memo_is_keyed_by_shape_and_every_bound(bound_dtype):
    sess = _session(_slice_model(bound_dtype))
    x = np.arange(6 * 7 * 5, dtype=np.float32).reshape(6, 7, 5)
    cases = [
        ((0,), (2,), (1,), (1,)),
        ((1,), (2,), (1,), (1,)),  # another start only
        ((1,), (3,), (1,), (1,)),  # another end only
        ((1,), (3,), (0,), (1,)),  # another axis only
        ((1,), (6,), (0,), (2,)),  # another step only
        ((-1,), (-100,), (2,), (-1,)),  # negative, clamped
        ((0, 1), (2, 3), (0, 2), (1, 1)),  # two axes
    ]
    for _ in range(2):  # the second round from the memo
        for starts, ends, axes, steps in cases:
            feeds = {
                "starts": np.array(starts, bound_dtype),
                "ends": np.array(ends, bound_dtype),
                "axes": np.array(axes, bound_dtype),
                "steps": np.array(steps, bound_dtype),
            }
            index = [slice(None)] * 3
            for s, e, a, st in zip(starts, ends, axes, steps):
                index[a] = slice(s, None if e < -x.shape[a] else e, st)
            for arr in (x, x[:3]):  # another input shape, same bounds
                got = sess.run(None, {"x": arr, **feeds})[0]
                np.testing.assert_array_equal(got, arr[tuple(index)])


def test_slice_memo_does_not_confuse_bounds_of_equal_bytes():
    """int32 [1, 0] and int64 [1] have the same eight bytes."""
    model = _model(
        [helper.make_node("Slice", ["x", "s", "e"], ["y"])],
        [_vi("x", np.float32, None), _vi("s", np.int64, None), _vi("e", np.int64, None)],
        [_vi("y", np.float32, None)],
    )
    run = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"]).compiled
    step = next(s for s in run.plan.steps if s.op_type == "Slice")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = step.fn(x, np.array([1, 0], np.int32), np.array([3, 2], np.int32))[0]
    b = step.fn(x, np.array([1], np.int64), np.array([3, 2], np.int32).view(np.int64))[0]
    np.testing.assert_array_equal(a, x[1:3, 0:2])
    assert b.shape != a.shape or not np.array_equal(a, b)


def test_slice_with_fed_bounds_still_rejects_a_zero_step():
    sess = _session(_slice_model(np.int64))
    x = np.zeros((4, 4), np.float32)
    feeds = {k: np.array([v], np.int64) for k, v in dict(starts=0, ends=2, axes=0).items()}
    assert sess.run(None, {"x": x, **feeds, "steps": np.array([1])})[0].shape == (2, 4)
    for _ in range(2):
        with pytest.raises(RunError, match="step cannot be 0"):
            sess.run(None, {"x": x, **feeds, "steps": np.array([0])})


# -- Where's small path -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "shapes",
    [
        ((2, 3), (2, 3), (2, 3)),
        ((), (2, 3), (2, 3)),  # scalar condition
        ((2, 3), (), (2, 3)),
        ((2, 3), (2, 3), ()),
        ((), (), ()),
        ((2, 1), (1, 3), (2, 3)),  # broadcasting: not the small path, the same answer
        ((1, 3), (2, 3), (1,)),
        ((128, 1), (1, 128), ()),  # small inputs, a large output: the bit select
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float16, np.bool_])
def test_where_small_path_equals_numpy_where(shapes, dtype):
    rng = np.random.default_rng(1)
    names = ["c", "x", "y"]
    model = _model(
        [helper.make_node("Where", names, ["z"])],
        [_vi("c", np.bool_, list(shapes[0]))]
        + [_vi(n, dtype, list(s)) for n, s in zip(names[1:], shapes[1:])],
        [_vi("z", dtype, None)],
        opset=16,
    )
    sess = _session(model)
    c = np.asarray(rng.random(shapes[0]) < 0.5)
    x = np.asarray(rng.standard_normal(shapes[1]) * 50).astype(dtype)
    y = np.asarray(rng.standard_normal(shapes[2]) * 50).astype(dtype)
    for _ in range(2):
        got = sess.run(None, {"c": c, "x": x, "y": y})[0]
        want = np.where(c, x, y)
        assert isinstance(got, np.ndarray)
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()


# -- Cast between NumPy's types -----------------------------------------------------------------

_CAST_TYPES = [np.bool_, np.int8, np.uint8, np.int32, np.int64, np.uint64, np.float16, np.float32,
               np.float64]  # fmt: skip


@pytest.mark.parametrize("to", _CAST_TYPES)
def test_cast_between_numpy_types_is_cast_numeric(to):
    values = np.array([0, 1, -1, 2.5, -2.5, 1e4, 65504, 3e9, np.nan, np.inf], np.float64)
    for src in _CAST_TYPES:
        with np.errstate(all="ignore"):
            x = values.astype(src)
            model = _model(
                [helper.make_node("Cast", ["x"], ["y"], to=np_dtype_to_tensor_dtype(np.dtype(to)))],
                [_vi("x", src, [values.size])],
                [_vi("y", to, None)],
            )  # fmt: skip
            got = _session(model).run(None, {"x": x})[0]
            want = cast_numeric(np, x, np.dtype(to))
        assert got.dtype == np.dtype(to)
        assert got.tobytes() == want.tobytes(), (src, to)


# -- recurrences over zero steps ------------------------------------------------------------------


@pytest.mark.parametrize("path", ["compiled", "numpy"])
@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("lens", [None, 0])
def test_zero_step_recurrence_ends_with_zero_states_as_onnxruntime(op, path, lens, monkeypatch):
    ort = pytest.importorskip("onnxruntime")
    if path == "compiled" and not jit.ENABLED:
        pytest.skip("numba not installed: no compiled recurrence")
    monkeypatch.setattr(jit, "ENABLED", path == "compiled")
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    hidden, n_in = 3, 2
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((1, gates * hidden, n)).astype(np.float32), w)
        for w, n in (("W", n_in), ("R", hidden))
    ]
    bias = rng.standard_normal((1, 2 * gates * hidden)).astype(np.float32)
    inits.append(numpy_helper.from_array(bias, "B"))
    states = ["h0"] + (["c0"] if op == "LSTM" else [])
    outs = ["Y", "Yh"] + (["Yc"] if op == "LSTM" else [])
    model = _model(
        [helper.make_node(op, ["X", "W", "R", "B", "" if lens is None else "lens", *states], outs,
                          hidden_size=hidden)],
        [_vi("X", np.float32, ["T", 1, n_in]), _vi("lens", np.int32, [1])]
        + [_vi(s, np.float32, [1, 1, hidden]) for s in states],
        [_vi(o, np.float32, None) for o in outs],
        inits,
        opset=14,
    )  # fmt: skip
    feeds = {"X": np.zeros((0, 1, n_in), np.float32)}
    feeds |= {s: np.full((1, 1, hidden), 0.5, np.float32) for s in states}
    if lens is not None:
        feeds["lens"] = np.array([lens], np.int32)
    else:
        model.graph.input.remove(next(i for i in model.graph.input if i.name == "lens"))
    got = _session(model).run(None, feeds)
    assert got[0].shape == (0, 1, 1, hidden)
    for s in got[1:]:
        assert s.shape == (1, 1, hidden)
        assert not s.any()  # zeros, not the initial 0.5
    if lens is not None:
        # Without sequence_lens onnxruntime 1.32 aborts the process on a zero-step GRU
        # ("terminate called without an active exception") and hands back uninitialised
        # states for LSTM: compared with sequence_lens [0], which it answers with zeros
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        for g, w in zip(got, sess.run(None, feeds)):
            assert g.shape == w.shape
            np.testing.assert_array_equal(g, w)


# -- ufunc steps writing into a dead input's buffer ----------------------------------------------


def test_ufunc_chain_reuses_buffers_and_falls_back_when_a_feed_broadcasts_past_it():
    """Neg -> Add -> Mul over inputs of one named dim: each step writes into the buffer of
    the step before (out as the ufunc's positional argument); feeds whose sizes broadcast
    past that buffer (the model's dims say they agree, the feeds do not) allocate instead."""
    from onnxep.execute.codegen import reusable_inputs

    model = _model(
        [
            helper.make_node("Neg", ["x"], ["t"]),
            helper.make_node("Add", ["t", "y"], ["u"]),
            helper.make_node("Mul", ["u", "y"], ["z"]),
        ],
        [_vi("x", np.float32, ["n"]), _vi("y", np.float32, ["n"])],
        [_vi("z", np.float32, ["n"])],
    )
    sess = _session(model)
    assert len(reusable_inputs(sess.compiled.plan)) == 2
    for xs, ys in (((3,), (3,)), ((1,), (3,)), ((3,), (3,)), ((3,), (1,))):
        x = np.arange(1, xs[0] + 1, dtype=np.float32)
        y = np.full(ys, 2.0, np.float32)
        for _ in range(2):
            got = sess.run(None, {"x": x, "y": y})[0]
            np.testing.assert_array_equal(got, (-x + y) * y)
            assert not np.shares_memory(got, x) and not np.shares_memory(got, y)


# -- Reduce over fixed axes ------------------------------------------------------------------


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_reduce_over_fixed_axes_per_shape(op, keepdims, dtype):
    """The axes worked out once per input shape: several shapes through one session, an
    empty reduction and NaN included, against NumPy's reductions."""
    axes = np.array([-1, 0], np.int64)
    model = _model(
        [helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)],
        [_vi("x", dtype, None)],
        [_vi("y", dtype, None)],
        [numpy_helper.from_array(axes, "axes")],
        opset=18,
    )
    sess = _session(model)
    want_of = {"ReduceSum": np.sum, "ReduceMean": np.mean, "ReduceMax": np.max, "ReduceMin": np.min}
    rng = np.random.default_rng(2)
    for shape in ((2, 3, 4), (5, 1, 2), (2, 3, 4), (3, 7)):
        x = (rng.standard_normal(shape) * 10).astype(dtype)
        if x.dtype.kind == "f":
            x.reshape(-1)[1] = np.nan
        for _ in range(2):
            got = sess.run(None, {"x": x})[0]
            with np.errstate(all="ignore"):
                want = np.asarray(want_of[op](x, axis=(-1, 0), keepdims=bool(keepdims)))
            assert got.dtype == x.dtype and got.shape == want.shape
            if op in ("ReduceSum", "ReduceMean") and x.dtype.kind == "i":
                np.testing.assert_allclose(got, want.astype(x.dtype), atol=1)
            else:
                assert got.tobytes() == want.astype(x.dtype).tobytes()
    empty = np.zeros((0, 3), dtype)
    got = sess.run(None, {"x": empty})[0]
    assert got.shape == ((1, 1) if keepdims else ())
