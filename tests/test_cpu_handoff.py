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
