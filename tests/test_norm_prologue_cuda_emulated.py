"""The GEMVs' RMS-norm prologue on the CPU kernel emulator: the same bits as ``norm_rows``.

``fuse_norm_matmul`` folds a SimplifiedLayerNormalization or SkipSimplifiedLayerNormalization
into the MatMulNT or MatMulNBits GEMV that reads it; on CUDA the GEMV then normalises its
rows itself (``norm_cuda.NORM_PROLOGUE``). Here each normalising launch is compared byte
for byte with what the unfused nodes' kernels give: ``norm_rows`` (the norm's CUDA kernel),
then the same GEMV on its output; and the residual sum it writes with ``norm_rows``'s.
Lengths cover a warp per row (K <= 256), a block per row of fewer threads than the GEMV's
block (896), as many (2048) and more (3584 and 8192: the block stands in for 512 and 1024
threads), K off the 8-value vectors (element by element), a skip per row and one
broadcast over the rows, and the norm's bias.
"""

from __future__ import annotations

import cuda_emulator as emu
import numpy as np
import pytest
from test_gemv_nt_cuda_emulated import HOST_NT_SMEM
from test_nbits_mma_cuda_emulated import install as install_mma
from test_nbits_mma_cuda_emulated import weight_tables

from onnxep.providers_cuda.ops import gemv_nt_cuda as G
from onnxep.providers_cuda.ops import nbits_mma_cuda as M
from onnxep.providers_cuda.ops.norm_cuda import RMS, NormKernel

F16, F32 = np.float16, np.float32
EPS = 1e-6


@pytest.fixture
def emulated(monkeypatch):
    install_mma(monkeypatch)  # also routes reduce_cuda (norm_rows, gemv_nt) to the emulator
    monkeypatch.setattr(G, "NT_SMEM", HOST_NT_SMEM)
    emu.ALL_NAMES.setdefault(G.source(), G.GEMV_NT_NAMES)


def _norm_inputs(rng, m, k, dtype, skip, nbias):
    x = rng.standard_normal((m, k)).astype(dtype)
    gamma = (rng.standard_normal(k) * 0.5 + 1).astype(dtype)
    s = None
    if skip == "rows":
        s = rng.standard_normal((m, k)).astype(dtype)
    elif skip == "broadcast":
        s = rng.standard_normal((1, k)).astype(dtype)
    b = rng.standard_normal(k).astype(dtype) if nbias else None
    return x, s, gamma, b


def _unfused_norm(x, skip, gamma, nbias):
    """norm_rows (emulated) as the CUDA SimplifiedLayerNormalization / SkipSimplified... run it:
    the normalised rows and the residual sum (None without a skip)."""
    m, k = x.shape
    kern = NormKernel([np.dtype(x.dtype)], RMS, EPS)
    launch = kern.prepare(m, k, np.dtype(x.dtype), 1 if skip is None else skip.shape[0])
    y = np.empty_like(x)
    total = None if skip is None else np.empty_like(x)
    launch(x, gamma, y, None, skip, nbias, total)
    return y, total


def _norm_arg(x, skip, gamma, nbias, with_sum):
    total = np.empty_like(x) if with_sum else None
    rows = 1 if skip is None else skip.shape[0]
    return (skip, rows, nbias, gamma, total, EPS), total


CASES = [
    # (M, K, skip, norm bias)
    (1, 64, None, False),
    (3, 200, "rows", False),
    (1, 896, "rows", False),
    (2, 896, "broadcast", True),
    (1, 2048, "rows", False),
    (1, 3584, "rows", True),
    (1, 8192, None, False),
    (5, 100, "rows", False),  # K off the vectors: element by element
    (8, 136, "rows", True),
]


@pytest.mark.parametrize("dtype", [F16, F32], ids=["f16", "f32"])
@pytest.mark.parametrize(("m", "k", "skip", "nbias"), CASES)
def test_matmul_nt_prologue_gives_norm_rows_bits(m, k, skip, nbias, dtype, emulated):
    if not G.norm_fits(m, k, dtype):
        pytest.skip("the rows do not fit the staging budget (the node runs two launches)")
    rng = np.random.default_rng(m * k)
    x, s, gamma, b = _norm_inputs(rng, m, k, dtype, skip, nbias)
    wt = (rng.standard_normal((24, k)) / np.sqrt(k)).astype(dtype)
    h, total = _unfused_norm(x, s, gamma, b)
    want = G.GemvNT(np, dtype)(h, wt)
    norm, got_total = _norm_arg(x, s, gamma, b, s is not None)
    got = G.GemvNT(np, dtype, norm=True)(x, wt, norm=norm)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    if s is not None:
        np.testing.assert_array_equal(got_total.view(np.uint8), total.view(np.uint8))


def test_matmul_nt_prologue_with_swiglu_and_bias(emulated):
    rng = np.random.default_rng(3)
    x, s, gamma, _ = _norm_inputs(rng, 2, 896, F16, "rows", False)
    wt = (rng.standard_normal((40, 896)) / 30).astype(F16)
    bias = rng.standard_normal(40).astype(F16)
    h, _ = _unfused_norm(x, s, gamma, None)
    want = G.GemvNT(np, F16)(h, wt, bias, swiglu=True)
    norm, _ = _norm_arg(x, s, gamma, None, False)
    got = G.GemvNT(np, F16, norm=True)(x, wt, bias, swiglu=True, norm=norm)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))


@pytest.mark.parametrize("kind", ["f16", "f16-level4", "f32-level4"])
@pytest.mark.parametrize("swiglu", [False, True], ids=["", "swiglu"])
@pytest.mark.parametrize(("m", "k", "skip", "nbias"), CASES)
def test_nbits_prologue_gives_norm_rows_bits(m, k, skip, nbias, swiglu, kind, emulated):
    """float16 A, and A rounded to int8 per block (accuracy_level 4: the unfused norm's
    output, float16 or float32, rounded as quantize_a_int8 rounds it)."""
    dtype, q8 = (F32 if kind.startswith("f32") else F16), kind.endswith("level4")
    chunks = -(-k // 32)
    if not M.fits(m, chunks, -(-k // 32) if q8 else 0):
        pytest.skip("the rows do not fit the staging budget (the node runs two launches)")
    rng = np.random.default_rng(m + k)
    x, s, gamma, b = _norm_inputs(rng, m, k, dtype, skip, nbias)
    n = 32
    tables, layout = weight_tables(rng, k, n, dtype=dtype)
    h, total = _unfused_norm(x, s, gamma, b)
    cols = n // 2 if swiglu else n
    plain = M.NbitsMma(np, dtype, dtype, M.ZP_PACKED, 32, q8=q8, swiglu=swiglu)
    want = plain(h, m, cols, k, tables, layout)
    norm, got_total = _norm_arg(x, s, gamma, b, s is not None)
    fused = M.NbitsMma(np, dtype, dtype, M.ZP_PACKED, 32, q8=q8, swiglu=swiglu, norm=True)
    got = fused(x, m, cols, k, tables, layout, norm=norm)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    if s is not None:
        np.testing.assert_array_equal(got_total.view(np.uint8), total.view(np.uint8))


def test_only_block_zero_writes_the_sum(emulated):
    """Many blocks normalise the same rows; the sum is written once (the emulator's guard
    bytes and the NaN-free result show no block wrote past it or left it unwritten)."""
    rng = np.random.default_rng(5)
    x, s, gamma, _ = _norm_inputs(rng, 1, 256, F16, "rows", False)
    wt = (rng.standard_normal((600, 256)) / 16).astype(F16)  # 75 blocks
    norm, total = _norm_arg(x, s, gamma, None, True)
    total.fill(np.nan)
    G.GemvNT(np, F16, norm=True)(x, wt, norm=norm)
    np.testing.assert_array_equal(total, (x.astype(F32) + s.astype(F32)).astype(F16))
