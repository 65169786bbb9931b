"""providers_cuda.blas on the GPU: numpy.matmul semantics, float16 accumulation, stream capture."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from onnxep.providers_cuda import blas

cupy = pytest.importorskip("cupy", reason="the CUDA tests need CuPy and a GPU")

SHAPES = [
    ((3, 4), (4, 5)),
    ((4,), (4, 5)),
    ((2, 3, 4), (4, 5)),
    ((3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (1, 3, 4, 5)),
    ((2, 3, 64, 32), (2, 3, 32, 48)),
    ((0, 3, 4), (4, 5)),
    ((3, 0), (0, 5)),
]
TOL = {"float32": 1e-5, "float16": 2e-3, "float64": 1e-12}


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize(("sa", "sb"), SHAPES)
def test_matches_numpy(sa, sb, dtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal(sa).astype(dtype)
    b = rng.standard_normal(sb).astype(dtype)
    got = blas.matmul(cupy.asarray(a), cupy.asarray(b)).get()
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert got.shape == ref.shape and got.dtype == np.dtype(dtype)
    tol = TOL[dtype]
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=tol, atol=tol * 10)


def test_transposed_views_and_gemm_beta():
    rng = np.random.default_rng(1)
    a = cupy.asarray(rng.standard_normal((5, 3)).astype(np.float32))
    b = cupy.asarray(rng.standard_normal((4, 5)).astype(np.float32))
    c = cupy.asarray(rng.standard_normal((3, 4)).astype(np.float32))
    out = c.copy()
    blas.gemm(a, b, trans_a=True, trans_b=True, alpha=0.5, beta=2.0, out=out)
    ref = 0.5 * (a.get().T @ b.get().T) + 2.0 * c.get()
    np.testing.assert_allclose(out.get(), ref, rtol=1e-5, atol=1e-5)


def test_float16_accumulates_in_float32():
    # 4096 products of ~1: a float16 accumulator would lose whole units; float32 does not.
    k = 4096
    a = cupy.full((2, k), 1.0009765625, dtype=cupy.float16)  # 1 + 2**-10
    b = cupy.ones((k, 3), dtype=cupy.float16)
    got = blas.matmul(a, b).get().astype(np.float64)
    want = k * 1.0009765625
    assert np.all(np.abs(got - want) <= want * 1e-3)


def test_works_inside_stream_capture():
    rng = np.random.default_rng(2)
    a = cupy.asarray(rng.standard_normal((2, 64, 32)).astype(np.float32))
    b = cupy.asarray(rng.standard_normal((32, 16)).astype(np.float32))
    a2 = cupy.asarray(rng.standard_normal((3, 8, 32)).astype(np.float16))
    b2 = cupy.asarray(rng.standard_normal((3, 32, 8)).astype(np.float16))
    out = cupy.empty((2, 64, 16), cupy.float32)
    out2 = cupy.empty((3, 8, 8), cupy.float16)
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        blas.matmul(a, b, out=out)  # warm-up: the handle and the stream's workspace
        blas.matmul(a2, b2, out=out2)
        s.synchronize()
        s.begin_capture()
        blas.matmul(a, b, out=out)
        blas.matmul(a2, b2, out=out2)
        graph = s.end_capture()
        out.fill(0)
        out2.fill(0)
        graph.launch(s)
        s.synchronize()
    np.testing.assert_allclose(out.get(), a.get() @ b.get(), rtol=1e-5, atol=1e-4)
    ref2 = a2.get().astype(np.float32) @ b2.get().astype(np.float32)
    np.testing.assert_allclose(out2.get().astype(np.float32), ref2, rtol=2e-3, atol=2e-2)


def test_cupy_matmul_refuses_inside_capture_where_blas_works():
    """Why blas.py exists: CuPy's own wrapper refuses during capture (GPU.md)."""
    a = cupy.ones((8, 8), cupy.float32)
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        cupy.matmul(a, a)
        s.synchronize()
        s.begin_capture()
        try:
            with pytest.raises(Exception, match="capture"):
                cupy.matmul(a, a)
        finally:
            with contextlib.suppress(Exception):
                s.end_capture()


# ----------------------------------------------------------------------------- the GEMV path
# The GEMV kernel serves onnxep::MatMulBias (and is tested on its own); a plain MatMul of the
# same shapes runs cuBLAS, which was faster at every Qwen2.5 decode shape on the H200.


def _gemv_node(op: str, dtype):
    from onnxep.providers.node import NodeInfo, ValueInfo

    n_in = 3 if op == "MatMulBias" else 2
    ins = tuple(ValueInfo(f"x{i}", "tensor", np.dtype(dtype)) for i in range(n_in))
    domain = "onnxep" if op == "MatMulBias" else ""
    return NodeInfo(op, domain, "n", 13, {}, ins, (ValueInfo("y"),))


def _gemv_runner(op: str, dtype):
    """``op`` ("Gemv": the kernel itself, "MatMul" or "MatMulBias") as a node's run function."""
    from onnxep.providers_cuda.ops import gemv_cuda as G
    from onnxep.providers_cuda.ops import op_mat_mul, op_matmul_bias
    from onnxep.providers_cuda.xp import cuda_namespace

    if op == "Gemv":
        gemv = G.Gemv(cuda_namespace(), dtype)
        return lambda a, b: (gemv(a, b),)
    build = op_matmul_bias.matmul_bias if op == "MatMulBias" else op_mat_mul.mat_mul
    return build(_gemv_node(op, dtype), cuda_namespace())


GEMV_SHAPES = [  # (A's leading dims, K, N): decode shapes, K tails, N without 16-byte rows
    ((1,), 896, 896),
    ((1, 1), 896, 4864),
    ((1,), 4864, 896),
    ((1,), 896, 151936),
    ((2,), 37, 24),
    ((3,), 1000, 40),
    ((4,), 129, 13),
    ((2, 3), 64, 264),
    ((8,), 1536, 8960),
    ((), 33, 17),
]


@pytest.mark.parametrize("op", ["Gemv", "MatMulBias", "MatMul"])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize(("lead", "k", "n"), GEMV_SHAPES)
def test_gemv_matches_numpy_and_repeats_bit_for_bit(lead, k, n, dtype, op, monkeypatch):
    from onnxep.providers_cuda.ops import gemv_cuda as G

    if op == "MatMul":  # cuBLAS, never the GEMV

        def no_gemv(*args, **kw):
            raise AssertionError("a plain MatMul ran the GEMV kernel")

        monkeypatch.setattr(G.Gemv, "__call__", no_gemv)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((*lead, k)).astype(dtype)
    b = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype)
    bias = rng.standard_normal(n).astype(dtype)
    args = [cupy.asarray(a), cupy.asarray(b)] + ([cupy.asarray(bias)] if op == "MatMulBias" else [])
    run = _gemv_runner(op, dtype)
    assert G.Gemv(cupy, dtype).takes(args[0], args[1])
    (got,) = run(*args)
    (again,) = run(*args)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    if op == "MatMulBias":
        ref = ref + bias.astype(np.float64)
    assert got.shape == ref.shape and got.dtype == np.dtype(dtype)
    tol = 2e-3 if dtype == "float16" else 2e-5
    np.testing.assert_allclose(got.get().astype(np.float64), ref, rtol=tol, atol=tol)
    assert cupy.array_equal(got.view(cupy.uint8), again.view(cupy.uint8))  # no float atomics


def test_gemv_agrees_with_cublas_within_float16_rounding():
    rng = np.random.default_rng(4)
    a = cupy.asarray(rng.standard_normal((1, 896)).astype(np.float16))
    b = cupy.asarray((rng.standard_normal((896, 4864)) * 0.05).astype(np.float16))
    (got,) = _gemv_runner("Gemv", "float16")(a, b)
    want = blas.matmul(a, b)
    diff = cupy.abs(got.astype(cupy.float32) - want.astype(cupy.float32))
    scale = cupy.abs(want.astype(cupy.float32)) + 1e-2
    assert float((diff / scale).max()) < 4e-3


def test_gemv_works_inside_stream_capture():
    rng = np.random.default_rng(5)
    a = cupy.asarray(rng.standard_normal((1, 896)).astype(np.float16))
    b = cupy.asarray((rng.standard_normal((896, 896)) * 0.05).astype(np.float16))  # split K
    bias = cupy.asarray(rng.standard_normal(896).astype(np.float16))
    run = _gemv_runner("MatMulBias", "float16")
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        (eager,) = run(a, b, bias)
        s.synchronize()
        s.begin_capture()
        (out,) = run(a, b, bias)
        graph = s.end_capture()
        for _ in range(3):  # each replay finds the split tickets the last one put back to zero
            out.fill(0)
            graph.launch(s)
            s.synchronize()
            assert cupy.array_equal(out.view(cupy.uint16), eager.view(cupy.uint16))


def test_more_rows_or_a_batched_weight_go_to_cublas():
    from onnxep.providers_cuda.ops import gemv_cuda as G

    gemv = G.Gemv(cupy, "float16")
    b = cupy.zeros((64, 32), cupy.float16)
    assert not gemv.takes(cupy.zeros((9, 64), cupy.float16), b)
    assert not gemv.takes(cupy.zeros((1, 64), cupy.float16), cupy.zeros((2, 64, 32), cupy.float16))
    (y,) = _gemv_runner("MatMul", "float16")(cupy.ones((9, 64), cupy.float16), b)
    assert y.shape == (9, 32)
