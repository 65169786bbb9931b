"""The tensor-core int4 MatMulNBits GEMV (``nbits_mma_cuda``) on the GPU.

float16 4-bit nodes of up to 8 rows run it: checked against the CPU provider's kernel on
the GPU tests' cases (tests/cuda/test_cuda_quant.py's tolerances), at the decode shapes of
Qwen2.5-0.5B/1.5B (down projections whose tiles several warps share, a wide N), run to run
bit for bit, inside a CUDA graph, and the SwiGLU epilogue byte for byte against the
unfused SwiGLU kernel on the kernel's own plain output. The CUDA-core GEMV the other nodes
run is checked on the same float16 cases with the tensor-core route turned off. The
emulator tests (tests/test_nbits_mma_cuda_emulated.py) cover the same kernel on the CPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import test_cuda_quant as Q

cupy = pytest.importorskip("cupy", reason="the CUDA tests need CuPy and a GPU")

#: The float16 4-bit cases of test_cuda_quant the tensor-core GEMV takes.
CASES = [c for c in Q.NBITS_CASES if c[0] == 4 and c[2] != "float"]
F16, F32 = np.float16, np.float32
ROWS = (1, 2, 3, 5, 8)


@pytest.fixture
def mma_calls(monkeypatch):
    """Every call of the tensor-core GEMV in the test, as (rows, N, K)."""
    from onnxep.providers_cuda.ops import nbits_mma_cuda as M

    if not M.device_capable():
        pytest.skip("the tensor-core GEMV needs compute capability 8.0 (this device has less)")
    seen = []
    real = M.NbitsMma.__call__

    def call(self, a, m, n, k, *args, **kw):
        seen.append((m, n, k))
        return real(self, a, m, n, k, *args, **kw)

    monkeypatch.setattr(M.NbitsMma, "__call__", call)
    return seen


def test_capability_is_read_from_the_device():
    from onnxep.providers_cuda.ops import nbits_mma_cuda as M

    major = int(cupy.cuda.Device().compute_capability) // 10
    assert M.device_capable() == (major >= 8)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_matches_cpu_builder(case, mma_calls):
    Q.check_nbits(*case, np.float16, rows=ROWS)
    assert [m for m, _, _ in mma_calls] == list(ROWS)


@pytest.mark.parametrize("bias_kind", ["const", "input"])
def test_bias(bias_kind, mma_calls):
    Q.check_nbits(4, 32, "packed", 96, 37, np.float16, bias_kind=bias_kind, rows=(1, 5))
    assert len(mma_calls) == 2


@pytest.mark.parametrize(
    ("k", "n"),
    [(896, 1152), (896, 896), (896, 9728), (4864, 896), (1536, 2048), (8960, 1536),
     (1536, 8960), (896, 32768)],
)  # fmt: skip
@pytest.mark.parametrize("zp_kind", ["none", "packed"])
def test_decode_shapes(k, n, zp_kind, mma_calls):
    Q.check_nbits(4, 32, zp_kind, k, n, np.float16, rows=(1, 2))
    assert len(mma_calls) == 2


def test_long_k_with_several_rows_and_what_does_not_fit(mma_calls):
    """8960 values fit two rows of staged A; eight rows of them run the CUDA-core GEMV."""
    Q.check_nbits(4, 128, "none", 8960, 24, np.float16, rows=(1, 2, 8))
    assert [m for m, _, _ in mma_calls] == [1, 2]


@pytest.mark.parametrize(("k", "n"), [(4864, 896), (896, 151936)])
def test_repeats_bit_for_bit(k, n, mma_calls):
    cp = cupy
    rng = np.random.default_rng(9)
    b, scales, zp = Q.nbits_consts(rng, k, n, 4, 32, "packed", np.float16)
    node = Q.nbits_node(k, n, 4, 32, np.float16, b, scales, zp)
    fn = Q.builders()[1](node, Q.device_xp())
    a = cp.asarray(rng.standard_normal((1, k)).astype(np.float16))
    dev = [cp.asarray(v) for v in (b, scales, zp)]
    (got,) = fn(a, *dev)
    (again,) = fn(a, *dev)
    assert cp.array_equal(got.view(cp.uint16), again.view(cp.uint16))
    assert len(mma_calls) == 2


def test_inside_stream_capture(mma_calls):
    cp = cupy
    rng = np.random.default_rng(10)
    k, n = 600, 45
    b, scales, zp = Q.nbits_consts(rng, k, n, 4, 32, "packed", np.float16)
    bias = rng.standard_normal(n).astype(np.float16)
    node = Q.nbits_node(k, n, 4, 32, np.float16, b, scales, zp, bias=bias)
    fn = Q.builders()[1](node, Q.device_xp())
    a = cp.asarray(rng.standard_normal((3, k)).astype(np.float16))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        (eager,) = fn(a)
        stream.begin_capture()
        (got,) = fn(a)
        graph = stream.end_capture()
        for _ in range(3):
            got.fill(0)
            graph.launch()
            stream.synchronize()
            assert cp.array_equal(got.view(cp.uint16), eager.view(cp.uint16))
    assert len(mma_calls) == 2


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_cuda_core_gemv_on_the_same_nodes(case, monkeypatch, mma_calls):
    from onnxep.providers_cuda.ops import op_matmul_nbits

    monkeypatch.setattr(op_matmul_nbits, "MMA_GEMV", False)
    Q.check_nbits(*case, np.float16, rows=ROWS)
    assert not mma_calls


#: accuracy_level 4: A rounded to int8 per block of K in the staging (float32 or float16 A).
LEVEL4 = [
    (4, 32, "packed", 200, 37),
    (4, 16, "packed", 72, 19),
    (4, 128, "none", 300, 23),
    (4, 32, "none", 1100, 50),
    (4, 32, "packed", 896, 4864),
    (4, 32, "none", 4864, 896),
]


@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("case", LEVEL4, ids=lambda c: "-".join(map(str, c)))
def test_accuracy_level_4_rounds_in_the_staging(case, dtype, mma_calls):
    from onnxep.providers_cuda.ops import nbits_mma_cuda as M

    Q.check_nbits(*case, dtype, accuracy_level=4, rows=(1, 3, 8))
    kb = -(-case[3] // case[1])  # K's blocks: the int8 staging keeps one amax each
    staged = [m for m in (1, 3, 8) if M.fits(m, -(-case[3] // 32), kb)]
    assert staged[:1] == [1], staged  # a decode row always stages
    assert [m for m, _, _ in mma_calls] == staged


def _tables(rng, k, n, dtype=F16):
    from onnxep.providers_cuda.ops.nbits_weights import Weights

    b, scales, zp = Q.nbits_consts(rng, k, n, 4, 32, "packed", dtype)
    node = Q.nbits_node(k, n, 4, 32, dtype, b, scales, zp)
    w = Weights(node, k, n, 4, 32, Q.device_xp())
    dev = [cupy.asarray(v) for v in (b, scales, zp)]
    tables = (w.b.get(dev[0]), w.scales.get(dev[1]), w.zp8.get(dev[2]))
    return tables, (w.kb, w.rs, w.zs, w.chunks)


@pytest.mark.parametrize(("m", "k", "h"), [(1, 896, 4864), (1, 64, 24), (3, 300, 11), (8, 96, 40)])
@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("dtype", [F16, F32], ids=["f16", "f32-level4"])
def test_swiglu_epilogue_rounds_as_the_unfused_swiglu(m, k, h, with_bias, dtype, mma_calls):
    from onnxep.providers_cuda.ops import fused_cuda as FC
    from onnxep.providers_cuda.ops import nbits_mma_cuda as M

    rng = np.random.default_rng(m + k)
    tables, layout = _tables(rng, k, 2 * h, dtype)
    bias = cupy.asarray(rng.standard_normal(2 * h).astype(dtype)) if with_bias else None
    a = cupy.asarray(rng.standard_normal((m, k)).astype(dtype))
    xp, q8 = Q.device_xp(), dtype == F32
    plain = M.NbitsMma(xp, dtype, dtype, M.ZP_PACKED, 32, q8=q8)(
        a, m, 2 * h, k, tables, layout, bias
    )
    fused = M.NbitsMma(xp, dtype, dtype, M.ZP_PACKED, 32, q8=q8, swiglu=True)
    got = fused(a, m, h, k, tables, layout, bias)
    fn = FC.kernels_for("swiglu_k", dtype)[np.dtype(dtype)]
    want = cupy.empty((m, h), dtype)
    n = np.int64(want.size)
    fn(FC.grid(want.size), (FC.BLOCK,), (plain, plain.reshape(-1)[h:], want, n, np.int64(h),
                                         np.int64(2 * h), np.int64(2 * h)))  # fmt: skip
    assert cupy.array_equal(got.view(cupy.uint8), want.view(cupy.uint8))
