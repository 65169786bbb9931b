"""The CUDA MatMulNT (``gemv_nt_cuda.GemvNT`` and its op builder) on the CPU kernel emulator.

Products are compared with NumPy in float64; the SwiGLU epilogue is compared byte for
byte with the emulated ``swiglu_k`` (the one-launch SwiGLU the unfused graph runs) applied
to the kernel's own plain output, so the fused rounding sequence is the unfused one. The
routing between the warp kernel and cuBLAS is a rule of shapes and the SM count, tested
as a function (cuBLAS is not emulated).
"""

from __future__ import annotations

import cuda_emulator as emu
import numpy as np
import pytest

from onnxep.errors import InvalidArgument, InvalidModel
from onnxep.providers.node import NodeInfo, ValueInfo
from onnxep.providers_cuda.ops import fused_cuda as FC
from onnxep.providers_cuda.ops import gemv_nt_cuda as G
from onnxep.providers_cuda.ops import op_onnxep_matmul_nt as op

F32, F16 = np.float32, np.float16
TOL = {F32: (2e-5, 2e-5), F16: (2e-3, 2e-3)}


#: The emulator's stand-in for the dynamic shared memory a normalising launch stages in.
HOST_NT_SMEM = "static uint4 nt_smem[48 * 1024 / 16];\n"


@pytest.fixture
def emulated(monkeypatch):
    why = emu.why_unavailable()
    if why:
        pytest.skip(why)
    emu.install(monkeypatch)
    monkeypatch.setattr(G, "NT_SMEM", HOST_NT_SMEM)
    emu.ALL_NAMES.setdefault(G.source(), G.GEMV_NT_NAMES)
    emu.ALL_NAMES.setdefault(FC.FUSED_BODY, FC.FUSED_NAMES)


def _launches(monkeypatch):
    names: list[str] = []
    real = G.GemvNT.emulated

    def counted(self, dt, name, *rest):
        names.append(name)
        return real(self, dt, name, *rest)

    monkeypatch.setattr(G.GemvNT, "emulated", counted)
    return names


def _operands(lead, k, n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((*lead, k)).astype(dtype)
    wt = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(dtype)
    bias = rng.standard_normal(n).astype(dtype)
    return a, wt, bias


def _reference(a, wt, bias):
    ref = a.astype(np.float64) @ wt.astype(np.float64).T
    return ref if bias is None else ref + bias.astype(np.float64)


# (A's leading dims, K, N): rows 1..8, N odd and even, K with and without 16-byte rows.
CASES = [
    ((1,), 64, 8),
    ((1,), 300, 33),
    ((2,), 37, 24),
    ((3,), 1000, 5),
    ((4,), 136, 13),
    ((5,), 20, 7),
    ((2, 3), 64, 30),
    ((7,), 41, 10),
    ((8,), 96, 17),
    ((), 33, 9),
    # long rows over few outputs: several warps share an output (k_split 2 to 8)
    ((3,), 1100, 6),
    ((2,), 4096, 24),
    ((1,), 2048, 40),
]


@pytest.mark.parametrize("dtype", [F16, F32], ids=["f16", "f32"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize(("lead", "k", "n"), CASES)
def test_matches_numpy_in_one_launch(lead, k, n, with_bias, dtype, emulated, monkeypatch):
    names = _launches(monkeypatch)
    gemv = G.GemvNT(np, dtype)
    a, wt, bias = _operands(lead, k, n, dtype)
    bias = bias if with_bias else None
    assert gemv.takes(a, wt)
    got = gemv(a, wt, bias)
    ref = _reference(a, wt, bias)
    assert got.shape == ref.shape and got.dtype == np.dtype(dtype)
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=rtol, atol=atol)
    vec = (k * np.dtype(dtype).itemsize) % 16 == 0
    (name,) = names
    assert name.startswith(
        f"gemv_nt<{G.CTYPE[np.dtype(dtype)]}, {16 // np.dtype(dtype).itemsize if vec else 1},"
    )
    # only a launch whose outputs split runs the instantiation with the slices' merge
    split = G.k_split(n, k // (16 // np.dtype(dtype).itemsize), gemv.sms)
    assert name.endswith(f", {int(split > 1)}>")


def test_a_misaligned_weight_runs_the_scalar_loads(emulated, monkeypatch):
    names = _launches(monkeypatch)
    gemv = G.GemvNT(np, F16)
    a, wt, _ = _operands((2,), 64, 9, F16)
    buf = np.empty(wt.size + 1, F16)
    shifted = buf[1:].reshape(wt.shape)  # 2 bytes off the 16-byte boundary
    shifted[...] = wt
    got = gemv(a, shifted)
    np.testing.assert_allclose(got.astype(np.float64), _reference(a, wt, None), **_tol(F16))
    assert names == ["gemv_nt<__half, 1, 2, 0, 0, 0>"]


def _tol(dtype):
    rtol, atol = TOL[dtype]
    return {"rtol": rtol, "atol": atol}


def swiglu_k(y, dtype):
    """The emulated one-launch SwiGLU the unfused graph runs on a packed [gate | up]."""
    fn = FC.kernels_for("swiglu_k", dtype)[np.dtype(dtype)]
    cols = y.shape[-1] // 2
    out = np.empty((*y.shape[:-1], cols), dtype)
    n = np.int64(out.size)
    fn(
        FC.grid(out.size),
        (FC.BLOCK,),
        (y, y.reshape(-1)[cols:], out, n, np.int64(cols), np.int64(2 * cols), np.int64(2 * cols)),
    )
    return out


@pytest.mark.parametrize("dtype", [F16, F32], ids=["f16", "f32"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize(
    ("lead", "k", "h"), [((1,), 64, 8), ((3,), 37, 5), ((8,), 160, 12), ((2,), 2048, 8)]
)
def test_swiglu_epilogue_rounds_as_the_unfused_swiglu(lead, k, h, with_bias, dtype, emulated):
    gemv = G.GemvNT(np, dtype)
    a, wt, bias = _operands(lead, k, 2 * h, dtype, seed=3)
    bias = bias if with_bias else None
    assert gemv.takes(a, wt, swiglu=True)
    got = gemv(a, wt, bias, swiglu=True)
    plain = gemv(a, wt, bias)  # the same sums, rounded as the GEMM's output
    want = swiglu_k(np.ascontiguousarray(plain.reshape(-1, 2 * h)), dtype).reshape(got.shape)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    # and close to the exact math
    ref = _reference(a, wt, bias)
    g, u = ref[..., :h], ref[..., h:]
    np.testing.assert_allclose(
        got.astype(np.float64), g / (1 + np.exp(-g)) * u, rtol=1e-2, atol=1e-2
    )


def _node(dtype, activation="none", n_in=3):
    ins = tuple(ValueInfo(f"x{i}", "tensor", np.dtype(dtype)) for i in range(n_in))
    attrs = {} if activation is None else {"activation": activation}
    return NodeInfo("MatMulNT", "onnxep", "nt", 1, attrs, ins, (ValueInfo("y"),))


@pytest.fixture
def builder(emulated, monkeypatch):
    """The CUDA op builder with its cuBLAS-path helpers (CuPy kernels) replaced by the generic
    ones: only the GEMV path runs here."""
    from onnxep.providers.ops import op_add, op_mat_mul, op_onnxep_swiglu

    monkeypatch.setattr(op.op_add, "add", op_add.add)
    monkeypatch.setattr(op.op_mat_mul, "mat_mul", op_mat_mul.mat_mul)
    monkeypatch.setattr(op.op_onnxep_swiglu, "swiglu", op_onnxep_swiglu.swiglu)
    return lambda dtype, act="none": op.matmul_nt(_node(dtype, act), np)


@pytest.mark.parametrize("act", ["none", "swiglu"])
def test_op_runs_the_gemv_with_bias_and_activation(builder, act, monkeypatch):
    names = _launches(monkeypatch)
    run = builder(F16, act)
    a, wt, bias = _operands((1, 1), 128, 24, F16, seed=5)
    (got,) = run(a, wt, bias)
    ref = _reference(a, wt, bias)
    if act == "swiglu":
        g, u = ref[..., :12], ref[..., 12:]
        ref = g / (1 + np.exp(-g)) * u
    assert got.shape == ref.shape
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=1e-2, atol=1e-2)
    assert len(names) == 1


def test_op_rejects_bad_operands_and_attributes(builder):
    run = builder(F32, "swiglu")
    a, wt, bias = _operands((1,), 16, 6, F32)
    with pytest.raises(InvalidArgument, match="even N"):
        run(a, wt[:5])
    with pytest.raises(InvalidArgument, match="last axis must be K"):
        run(a[..., :8], wt)
    with pytest.raises(InvalidArgument, match="bias must be a vector of N = 6"):
        run(a, wt, bias[:4])
    with pytest.raises(InvalidModel, match="activation must be one of"):
        builder(F32, "gelu")
    (y,) = run(a, wt, bias)  # still usable after the errors
    assert y.shape == (1, 3)


def test_routing_rule_follows_parallelism_not_shapes():
    sms = 132
    resident = sms * G.WARPS_PER_SM
    # decode shapes of a small model: well inside a few waves
    assert G.use_warps(1, 1152, sms) and G.use_warps(1, 4864, sms)
    assert G.use_warps(1, G.MAX_WAVES * resident, sms)
    assert not G.use_warps(1, G.MAX_WAVES * resident + 1, sms)
    assert not G.use_warps(1, 151936, sms)  # an LM head: cuBLAS
    # rows of A count: eight rows of a shape that one row fits
    n = G.MAX_WAVES * resident // 4
    assert G.use_warps(4, n, sms) and not G.use_warps(8, n, sms)
    # a smaller device takes fewer outputs
    assert G.use_warps(1, 20000, sms) and not G.use_warps(1, 20000, 40)
    assert not G.use_warps(G.GEMV_NT_MAX_M + 1, 16, sms) and not G.use_warps(0, 16, sms)


def test_long_rows_over_few_outputs_split_across_warps():
    sms = 132
    # a 1.5B decode step's down projection (1536 rows of 8960): 4 warps a row
    assert G.k_split(1536, 8960 // 8, sms) == 4
    # gate and up (17920 rows of 1536) already fill the device: a warp a row
    assert G.k_split(17920, 1536 // 8, sms) == 1
    # every slice keeps MIN_SLICE_CHUNKS, and the split stays within one block
    assert G.k_split(4, 40 * G.MIN_SLICE_CHUNKS, sms) == G.BLOCK // G.WARP
    assert G.k_split(4, 2 * G.MIN_SLICE_CHUNKS - 1, sms) == 1
    for rows, chunks in [(1, 1), (896, 608), (2048, 192), (10**6, 10**4)]:
        split = G.k_split(rows, chunks, sms)
        assert split in (1, 2, 4, 8)
        assert split == 1 or rows * split <= sms * G.WARPS_PER_SM


def test_takes_refuses_what_is_not_its_case(emulated):
    gemv = G.GemvNT(np, F32)
    a, wt, _ = _operands((1,), 16, 8, F32)
    assert gemv.takes(a, wt)
    assert not gemv.takes(a.astype(F16), wt)
    assert not gemv.takes(a, np.asfortranarray(wt))
    assert not gemv.takes(np.ones((9, 16), F32), wt)  # more rows than the kernel takes
    assert not gemv.takes(a, wt[:7], swiglu=True)
    assert not gemv.takes(a, np.ones((gemv.sms * G.WARPS_PER_SM * G.MAX_WAVES + 1, 16), F32))


@pytest.mark.parametrize("norm", [False, True], ids=["plain", "normalising"])
def test_driver_launch_signatures_match_the_kernels(emulated, monkeypatch, norm):
    """On a GPU the launches go through ``launch.Launcher``, which packs 8-byte arguments by
    a signature string: it must be the kernels' own (g++ reads it from the C parameters)."""
    from onnxep.providers_cuda import elementwise, launch

    made = []

    class Recorder:
        def __init__(self, fn, signature, dependent=False):
            made.append((fn.name, fn.signature, signature))
            assert dependent, "gemv_nt waits (pdl_wait) and is launched as a dependent kernel"

    monkeypatch.setattr(launch, "Launcher", Recorder)
    monkeypatch.setattr(elementwise, "stream_ptr_fn", lambda: lambda: 0)
    gemv = G.GemvNT(np, None, norm=norm)
    gemv.driver(list(gemv.fns))
    assert len(made) == len(G.GEMV_NT_NAMES) // 2
    for name, real, packed in made:
        assert packed == real, name


def test_gemv_nt_waits_before_it_touches_what_an_earlier_kernel_writes():
    """Launched with programmatic dependent launch, gemv_nt may start while the kernel that
    writes A still runs: before ``pdl_wait`` it may only prefetch its (constant) weights.
    Every read of A, the norm's staging and every store come after the wait."""
    body = G.GEMV_NT_BODY.split("__global__ void gemv_nt(")[1]
    wait = body.index("pdl_wait();")
    assert body.index("pdl_trigger();") < wait
    for use in (
        "nt_stage_norm(",
        "gemv_load<T, V>(ar)",
        "y[(i64)m * N + j] =",
        "gemv_load<T, V>(rows",
    ):
        assert body.index(use) > wait, use
    before = body[:wait]
    assert "a[" not in before and "y[" not in before and "gemv_load" not in before
