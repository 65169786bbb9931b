"""The compiled few-column product (``few_columns``) that convolutions over short signals
take: against a float64 product over shapes around its blocks (odd filter counts, odd and
even column counts, strided columns), and which products take it (by shape alone)."""

from __future__ import annotations

import numpy as np
import pytest

from onnxep.providers_cpu import jit
from onnxep.providers_cpu.ops import few_columns, nn_cpu

pytestmark = pytest.mark.skipif(not jit.ENABLED, reason="numba not available")


@pytest.mark.parametrize("m", [1, 3, 8, 129, 258])
@pytest.mark.parametrize("k", [1, 7, 64, 257, 388])
@pytest.mark.parametrize("n", [1, 2, 3, 5, 6])
def test_product_against_float64(m, k, n):
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    w = rng.standard_normal((m, k)).astype(np.float32)
    wide = rng.standard_normal((k, 2 * n)).astype(np.float32)
    for cols in (np.ascontiguousarray(wide[:, :n]), wide[:, ::2]):  # contiguous and strided
        out = np.full((m, n), np.nan, np.float32)
        few_columns.product(w, cols, out)
        want = w.astype(np.float64) @ cols.astype(np.float64)
        tol = 2e-6 * np.abs(w).astype(np.float64) @ np.abs(cols).astype(np.float64) + 1e-6
        assert (np.abs(out - want) <= tol).all()


def test_nan_and_inf_propagate():
    w = np.ones((8, 300), np.float32) * 0.5
    cols = np.ones((300, 3), np.float32)
    cols[5, 1] = np.nan
    cols[7, 2] = np.inf
    out = np.empty((8, 3), np.float32)
    few_columns.product(w, cols, out)
    assert np.isfinite(out[:, 0]).all() and np.isnan(out[:, 1]).all()
    assert np.isposinf(out[:, 2]).all()


def test_which_products_take_it():
    big = np.zeros((128, 388), np.float32)
    assert few_columns.applies(big, 3)
    assert not few_columns.applies(big, 1)  # BLAS's GEMV is as fast
    assert not few_columns.applies(big, few_columns.MAX_COLUMNS + 1)
    assert not few_columns.applies(np.zeros((64, 193), np.float32), 2)  # too small to gain
    assert not few_columns.applies(big.astype(np.float64), 3)
    tuned = nn_cpu.TunedMatmul(big)
    cols = np.ones((388, 3), np.float32)
    assert not getattr(tuned.pick(cols), "plain", False)
    np.testing.assert_array_equal(tuned(cols), np.zeros((128, 3), np.float32))
    assert getattr(tuned.pick(np.ones((388, 1), np.float32)), "plain", False)
