"""providers_cuda.blas without a GPU: the layout, stride and transpose logic against NumPy.

cuBLAS is replaced by a column-major GEMM written in NumPy that reads the
operands from the raw pointers, leading dimensions and batch strides blas.py
passes, exactly as cuBLAS would; the arrays are NumPy arrays in host memory.
A wrong op, ld, stride or operand order gives a wrong product here.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from onnxep.providers_cuda import blas


def _col_major(ptr: int, rows: int, cols: int, ld: int, dtype: np.dtype) -> np.ndarray:
    item = dtype.itemsize
    count = 0 if rows == 0 or cols == 0 else ld * (cols - 1) + rows
    raw = (ctypes.c_ubyte * (count * item)).from_address(ptr)
    flat = np.ctypeslib.as_array(raw).view(dtype)
    return np.lib.stride_tricks.as_strided(flat, (rows, cols), (item, ld * item))


class FakeCublas:
    """``cublasGemmEx`` and ``cublasGemmStridedBatchedEx`` over host memory."""

    DT = {
        blas.CUDA_R_32F: np.dtype(np.float32),
        blas.CUDA_R_16F: np.dtype(np.float16),
        blas.CUDA_R_64F: np.dtype(np.float64),
    }

    def __init__(self) -> None:
        self.calls: list[str] = []

    def _one(self, opa, opb, m, n, k, alpha_p, pa, dt, lda, pb, ldb, beta_p, pc, ldc):
        a = _col_major(pa, *((m, k) if opa == blas.OP_N else (k, m)), lda, dt)
        b = _col_major(pb, *((k, n) if opb == blas.OP_N else (n, k)), ldb, dt)
        a = a if opa == blas.OP_N else a.T
        b = b if opb == blas.OP_N else b.T
        scalar = ctypes.c_double if dt == np.float64 else ctypes.c_float
        alpha = scalar.from_address(alpha_p).value
        beta = scalar.from_address(beta_p).value
        c = _col_major(pc, m, n, ldc, dt)
        ab = alpha * (a.astype(np.float64) @ b.astype(np.float64))
        c[...] = (ab + beta * c.astype(np.float64) if beta else ab).astype(dt)

    def gemm_ex(self, h, opa, opb, m, n, k, al, pa, ta, lda, pb, tb, ldb, be, pc, tc, ldc, *_):
        assert ta == tb == tc
        self.calls.append("gemm")
        self._one(opa, opb, m, n, k, al, pa, self.DT[ta], lda, pb, ldb, be, pc, ldc)
        return 0

    def gemm_strided_batched_ex(
        self, h, opa, opb, m, n, k, al, pa, ta, lda, sa, pb, tb, ldb, sb, be, pc, tc, ldc, sc,
        count, *_,
    ):  # fmt: skip
        self.calls.append("batched")
        item = self.DT[ta].itemsize
        for i in range(count):
            self._one(
                opa, opb, m, n, k, al, pa + i * sa * item, self.DT[ta], lda,
                pb + i * sb * item, ldb, be, pc + i * sc * item, ldc,
            )  # fmt: skip
        return 0


@pytest.fixture
def fake(monkeypatch):
    lib = FakeCublas()
    monkeypatch.setattr(blas, "_cp", lambda: np)
    monkeypatch.setattr(blas, "_ptr", lambda x: x.ctypes.data)
    monkeypatch.setattr(blas, "_library", lambda: lib)
    monkeypatch.setattr(blas, "_stream_ptr", lambda: 0)
    monkeypatch.setattr(blas, "_handle_for", lambda lib, stream: 0)
    return lib


def _rand(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


SHAPES = [
    ((3, 4), (4, 5)),
    ((4,), (4, 5)),
    ((3, 4), (4,)),
    ((4,), (4,)),
    ((2, 3, 4), (4, 5)),  # a stack of rows times a weight: one tall GEMM
    ((3, 4), (2, 4, 5)),  # one matrix times a stack: batch stride 0 for a
    ((2, 1, 3, 4), (1, 3, 4, 5)),  # broadcast on both sides
    ((2, 3, 3, 4), (2, 3, 4, 5)),
    ((2, 3, 4), (4,)),
    ((4,), (2, 4, 5)),
    ((1, 3, 4), (1, 4, 5)),
    ((0, 3, 4), (4, 5)),
    ((3, 0), (0, 5)),
    ((2, 3, 0), (2, 0, 5)),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize(("sa", "sb"), SHAPES)
def test_matches_numpy_matmul(fake, sa, sb, dtype):
    rng = np.random.default_rng(0)
    a, b = _rand(rng, sa, dtype), _rand(rng, sb, dtype)
    got = blas.matmul(a, b)
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert got.shape == ref.shape and got.dtype == np.dtype(dtype)
    tol = 1e-5 if dtype == np.float32 else 2e-3
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol * 4)


def test_tall_product_is_one_call(fake):
    rng = np.random.default_rng(1)
    blas.matmul(_rand(rng, (2, 3, 4), np.float32), _rand(rng, (4, 5), np.float32))
    assert fake.calls == ["gemm"]


def test_transposed_views_are_read_in_place(fake, monkeypatch):
    rng = np.random.default_rng(2)
    a = _rand(rng, (2, 4, 3), np.float32).swapaxes(-1, -2)  # (2, 3, 4), column-major
    b = _rand(rng, (5, 4), np.float32).T  # (4, 5)
    copies = []
    real = np.ascontiguousarray
    monkeypatch.setattr(np, "ascontiguousarray", lambda x: copies.append(x.shape) or real(x))
    got = blas.matmul(a, b)
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)
    assert copies == []


def test_strided_slices_use_the_row_stride(fake):
    rng = np.random.default_rng(3)
    big = _rand(rng, (6, 10), np.float32)
    a = big[:, 2:6]  # rows 10 apart, 4 wide
    b = _rand(rng, (4, 3), np.float32)
    np.testing.assert_allclose(blas.matmul(a, b), a @ b, rtol=1e-5, atol=1e-5)


def test_unwalkable_batches_are_copied(fake):
    rng = np.random.default_rng(4)
    a = _rand(rng, (3, 2, 4, 5), np.float32).transpose(1, 0, 2, 3)  # batch dims out of order
    b = _rand(rng, (2, 3, 5, 2), np.float32)
    np.testing.assert_allclose(blas.matmul(a, b), a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("ta", "tb"), [(False, True), (True, False), (True, True)])
def test_gemm_transposes_and_alpha(fake, ta, tb):
    rng = np.random.default_rng(5)
    a = _rand(rng, (4, 3) if ta else (3, 4), np.float32)
    b = _rand(rng, (5, 4) if tb else (4, 5), np.float32)
    got = blas.gemm(a, b, trans_a=ta, trans_b=tb, alpha=0.5)
    ref = 0.5 * ((a.T if ta else a) @ (b.T if tb else b))
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_beta_adds_out(fake, dtype):
    rng = np.random.default_rng(7)
    a, b = _rand(rng, (3, 4), dtype), _rand(rng, (4, 5), dtype)
    c = _rand(rng, (3, 5), dtype)
    out = c.copy()
    blas.gemm(a, b, alpha=2.0, beta=0.5, out=out)
    ref = 2.0 * (a.astype(np.float64) @ b.astype(np.float64)) + 0.5 * c.astype(np.float64)
    tol = 2e-3 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=tol, atol=tol * 4)
    with pytest.raises(blas.BlasError, match="needs out"):
        blas.gemm(a, b, beta=1.0)


def test_out_is_written_in_place(fake):
    rng = np.random.default_rng(6)
    a, b = _rand(rng, (2, 3, 4), np.float32), _rand(rng, (2, 4, 5), np.float32)
    out = np.full((2, 3, 5), np.nan, np.float32)
    assert blas.matmul(a, b, out=out) is out
    np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)


def test_k_zero_fills_zeros(fake):
    out = np.full((3, 5), np.nan, np.float32)
    blas.matmul(np.ones((3, 0), np.float32), np.ones((0, 5), np.float32), out=out)
    assert (out == 0).all()


@pytest.mark.parametrize(
    ("a", "b", "out", "match"),
    [
        (np.ones((2, 3), np.float32), np.ones((3, 2), np.float16), None, "share a dtype"),
        (np.ones((2, 3), np.int32), np.ones((3, 2), np.int32), None, "float16, float32 or"),
        (np.ones((2, 3), np.float32), np.ones((4, 2), np.float32), None, "inner dims 3 and 4"),
        (np.ones((2, 2, 3), np.float32), np.ones((3, 3, 2), np.float32), None, "broadcast"),
        (np.ones((2, 3), np.float32), np.ones((3, 2), np.float32), np.ones((2, 3)), "out must"),
    ],
)
def test_bad_operands_name_the_problem(fake, a, b, out, match):
    with pytest.raises(blas.BlasError, match=match):
        blas.matmul(a, b, out=out)


def test_supports():
    assert blas.supports(np.dtype(np.float16)) and blas.supports(np.dtype(np.float32))
    assert blas.supports(np.dtype(np.float64)) and not blas.supports(np.dtype(np.int32))


@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_out_may_be_a_block_of_columns_of_a_wider_matrix(fake, beta):
    """A product written straight into columns 3..8 of a 12-column matrix (ldc = 12): the
    columns around it stay as they were."""
    rng = np.random.default_rng(8)
    a, wt = _rand(rng, (4, 6), np.float32), _rand(rng, (5, 6), np.float32)
    whole = _rand(rng, (4, 12), np.float32)
    before = whole.copy()
    blas.gemm(a, wt, trans_b=True, beta=beta, out=whole[:, 3:8])
    np.testing.assert_allclose(whole[:, 3:8], a @ wt.T + beta * before[:, 3:8], rtol=1e-5)
    np.testing.assert_array_equal(np.delete(whole, range(3, 8), axis=1),
                                  np.delete(before, range(3, 8), axis=1))  # fmt: skip
    with pytest.raises(blas.BlasError, match="block of columns"):
        blas.gemm(a, wt, trans_b=True, out=whole[:, 3:8].T.T[::2])


@pytest.mark.parametrize(("sa", "sb"), SHAPES)
def test_a_signature_seen_before_takes_the_kept_call_with_new_pointers(fake, sa, sb):
    """The second product of a signature skips the layout logic (the kept call), and
    must read the new operands and write a new output, not the first call's."""
    rng = np.random.default_rng(9)
    for trans in (False, True):
        results = []
        for _ in range(3):
            a = _rand(rng, sa, np.float32)
            b = _rand(rng, sb, np.float32)
            if trans and b.ndim >= 2:
                b = np.ascontiguousarray(b.swapaxes(-1, -2)).swapaxes(-1, -2)
            got = blas.matmul(a, b)
            np.testing.assert_allclose(got, np.matmul(a, b), rtol=1e-5, atol=1e-5)
            results.append(got)
        assert not np.shares_memory(results[0], results[1])


def test_kept_calls_honour_out_and_beta(fake):
    rng = np.random.default_rng(10)
    for _ in range(3):
        a, b = _rand(rng, (3, 4), np.float32), _rand(rng, (5, 4), np.float32)
        out = _rand(rng, (3, 5), np.float32)
        want = 2.0 * a @ b.T + out
        got = blas.gemm(a, b, trans_b=True, alpha=2.0, beta=1.0, out=out)
        assert got is out
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_products_that_copy_an_operand_are_not_kept(fake):
    rng = np.random.default_rng(11)
    a = _rand(rng, (2, 3, 6), np.float32)[:, :, ::2]  # no stride walks it: copied
    b = _rand(rng, (3, 5), np.float32)
    before = blas.kept_calls()
    np.testing.assert_allclose(blas.matmul(a, b), a @ b, rtol=1e-5, atol=1e-5)
    assert blas.kept_calls() == before
