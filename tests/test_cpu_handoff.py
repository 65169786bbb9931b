"""The compiled kernels' split (providers_cpu/handoff.py, nn_cpu.parallel_compiled): every
row computed exactly once, by one kernel call, on any split; errors raised to the caller;
a split asked for while another holds the pool runs on its caller alone."""

from __future__ import annotations

import numpy as np
import pytest

from onnxep.providers_cpu import handoff, jit
from onnxep.providers_cpu.ops import nn_cpu
from onnxep.providers_cpu.threads import blas_threads

needs_jit = pytest.mark.skipif(not jit.ENABLED, reason="numba not installed")

_kernels: dict = {}


def _count_rows():
    """``k(scale, r0, r1, hits, value)``: hits[r] += 1 and value[r] = a sum that depends
    on the row alone, for r in [r0 / scale, r1 / scale)."""
    if "count" not in _kernels:

        def k(scale, r0, r1, hits, value):
            for r in range(r0 // scale, r1 // scale):
                hits[r] += 1
                s = np.float32(0)
                for t in range(1, 200):
                    s += np.float32(r % 7) / np.float32(t)
                value[r] = s

        _kernels["count"] = jit.nb.njit(nogil=True)(k)
    return _kernels["count"]


def _raise_at_row():
    if "raise" not in _kernels:

        def k(row, r0, r1, hits):
            for r in range(r0, r1):
                hits[r] += 1
            if r0 <= row < r1:
                raise ValueError("row reached")

        _kernels["raise"] = jit.nb.njit(nogil=True)(k)
    return _kernels["raise"]


@pytest.fixture
def split_everything(monkeypatch):
    monkeypatch.setattr(nn_cpu, "COMPILED_MIN", 0)
    monkeypatch.setattr(nn_cpu, "NATIVE", True)
    with blas_threads(2):
        yield


@needs_jit
@pytest.mark.parametrize("rows", [1, 2, 3, 16, 17, 257])
@pytest.mark.parametrize("step", [1, 8])
def test_every_row_once_with_the_values_of_one_call(rows, step, split_everything):
    k = _count_rows()
    want = np.zeros(rows, np.float32)
    k(step, 0, step * rows, np.zeros(rows, np.int64), want)
    for _ in range(200):  # a helper that wakes late for an earlier split claims nothing new
        hits = np.zeros(rows, np.int64)
        value = np.full(rows, np.nan, np.float32)
        nn_cpu.parallel_compiled(rows, 1 << 30, k, (step,), (hits, value), step)
        assert (hits == 1).all()
        assert np.array_equal(value.view(np.uint32), want.view(np.uint32))


@needs_jit
def test_a_kernels_error_reaches_the_caller_and_the_pool_goes_on(split_everything):
    k = _raise_at_row()
    for row in (0, 40, 63):
        hits = np.zeros(64, np.int64)
        with pytest.raises(ValueError, match="row reached"):
            nn_cpu.parallel_compiled(64, 1 << 30, k, (row,), (hits,))
        assert hits.max() == 1  # no chunk ran twice
    hits = np.zeros(64, np.int64)
    nn_cpu.parallel_compiled(64, 1 << 30, k, (-1,), (hits,))
    assert (hits == 1).all()


@needs_jit
def test_a_split_while_the_pool_is_held_runs_on_its_caller(split_everything):
    k = _count_rows()
    pool = handoff.pool(max(1, nn_cpu.cpu_count() - 1))
    hits = np.zeros(32, np.int64)
    value = np.zeros(32, np.float32)
    assert pool.lock.acquire(timeout=5)
    try:
        assert not pool.split(handoff.driver(k, 1, 2), 32, 8, 1, (1, hits, value))
        nn_cpu.parallel_compiled(32, 1 << 30, k, (1,), (hits, value))
    finally:
        pool.lock.release()
    assert (hits == 1).all()


@needs_jit
def test_under_the_bound_or_on_one_thread_one_call(monkeypatch):
    calls = []

    def kernel(r0, r1, out):
        calls.append((r0, r1))

    monkeypatch.setattr(nn_cpu, "COMPILED_MIN", 1 << 20)
    with blas_threads(2):
        nn_cpu.parallel_compiled(64, (1 << 20) - 1, kernel, (), (None,), 4)
    with blas_threads(1):
        nn_cpu.parallel_compiled(64, 1 << 30, kernel, (), (None,), 4)
    assert calls == [(0, 256), (0, 256)]


@needs_jit
def test_a_run_that_asks_for_no_spinning_leaves_the_helpers_asleep(monkeypatch):
    import time

    from onnxep.providers_cpu import threads

    monkeypatch.setattr(nn_cpu, "COMPILED_MIN", 0)
    monkeypatch.setattr(nn_cpu, "NATIVE", True)
    k = _count_rows()
    pool = handoff.pool(max(1, nn_cpu.cpu_count() - 1))
    hits = np.zeros(64, np.int64)
    value = np.zeros(64, np.float32)
    with blas_threads(2, spin=False):
        assert not threads.run_spins()
        nn_cpu.parallel_compiled(64, 1 << 30, k, (1,), (hits, value))
    assert threads.run_spins()
    assert (hits == 1).all()
    if nn_cpu.cpu_count() < 2:
        return  # one core: no split ran, nothing to check of the helpers
    assert pool.after == 0  # the helpers poll no more after that split
    deadline = time.monotonic() + 10
    while not all(pool.ctl[handoff._slot_asleep(h)] for h in range(pool.helpers)):  # noqa: SLF001
        assert time.monotonic() < deadline, "a helper kept running after a quiet split"
        time.sleep(0.001)
    with blas_threads(2):  # the default again: the next split's helpers poll a while
        nn_cpu.parallel_compiled(64, 1 << 30, k, (1,), (hits, value))
    assert pool.after == pool.iters
    assert (hits == 2).all()


def _one_row_model():
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).random((512, 1024), np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "one_row",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1024])],
        [numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), w


@needs_jit
def test_the_session_option_reaches_the_split_and_the_report():
    import onnxep

    model, w = _one_row_model()
    so = onnxep.SessionOptions(intra_op_num_threads=2)
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    sess = onnxep.InferenceSession(model, so, providers=["cpu"])
    assert "session.intra_op.allow_spinning=0" in str(sess.placement())
    x = np.random.default_rng(1).random((1, 512), np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, x.astype(np.float64) @ w, rtol=1e-5)
    if nn_cpu.cpu_count() >= 2 and nn_cpu.NATIVE:
        assert handoff.pool(nn_cpu.cpu_count() - 1).after == 0
    default = onnxep.InferenceSession(model, providers=["cpu"])
    assert "poll 200 us for the next split" in str(default.placement())


def test_a_bad_spinning_value_is_named_and_the_next_session_works():
    import onnxep
    from onnxep.errors import OnnxepError

    model, _ = _one_row_model()
    so = onnxep.SessionOptions()
    so.add_session_config_entry("session.intra_op.allow_spinning", "yes")
    with pytest.raises(OnnxepError, match=r"session\.intra_op\.allow_spinning.*'0' or '1'"):
        onnxep.InferenceSession(model, so, providers=["cpu"])
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    assert sess.run(None, {"x": np.ones((1, 512), np.float32)})[0].shape == (1, 1024)
