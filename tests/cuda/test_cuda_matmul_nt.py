"""onnxep::MatMulNT on the GPU: the warp-per-output GEMV over a ``[N, K]`` weight, the cuBLAS
path the routing rule sends wide products to, capture, and fuse_transposed_weights on the
factory's tiny fp16 genai decoder (greedy tokens equal the unfused CUDA session's and the
unfused CPU session's, eager and captured). The emulator tests
(tests/test_gemv_nt_cuda_emulated.py) cover the kernel's tails on the CPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import onnxep
from onnxep.providers import fusions as F

cupy = pytest.importorskip("cupy", reason="the CUDA tests need CuPy and a GPU")

ROOT = Path(__file__).resolve().parents[2]
NAME = "fuse_transposed_weights"
STEPS = 32
PROMPT = np.random.default_rng(9).integers(0, 512, 8)


def _node(dtype, activation="none"):
    from onnxep.providers.node import NodeInfo, ValueInfo

    ins = tuple(ValueInfo(f"x{i}", "tensor", np.dtype(dtype)) for i in range(3))
    return NodeInfo(
        "MatMulNT", "onnxep", "nt", 1, {"activation": activation}, ins, (ValueInfo("y"),)
    )


def _op(dtype, activation="none"):
    from onnxep.providers_cuda.ops import op_onnxep_matmul_nt as op
    from onnxep.providers_cuda.xp import cuda_namespace

    return op.matmul_nt(_node(dtype, activation), cuda_namespace())


def _operands(lead, k, n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((*lead, k)).astype(dtype)
    wt = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(dtype)
    bias = rng.standard_normal(n).astype(dtype)
    return a, wt, bias


def _reference(a, wt, bias, activation):
    ref = a.astype(np.float64) @ wt.astype(np.float64).T
    if bias is not None:
        ref = ref + bias.astype(np.float64)
    if activation == "swiglu":
        h = ref.shape[-1] // 2
        g, u = ref[..., :h], ref[..., h:]
        ref = g / (1 + np.exp(-g)) * u
    return ref


SHAPES = [  # (A's leading dims, K, N): Qwen2.5 decode shapes, K tails, odd N, rows 1..8
    ((1,), 896, 1152),
    ((1, 1), 896, 896),
    ((1,), 4864, 896),
    ((1,), 896, 9728),
    ((2,), 37, 24),
    ((3,), 1000, 42),
    ((4,), 129, 14),
    ((2, 3), 64, 264),
    ((8,), 1536, 8960),
    ((), 33, 18),
]


@pytest.mark.parametrize("activation", ["none", "swiglu"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["", "bias"])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize(("lead", "k", "n"), SHAPES)
def test_gemv_matches_numpy_and_repeats_bit_for_bit(lead, k, n, dtype, with_bias, activation):
    from onnxep.providers_cuda.ops import gemv_nt_cuda as G

    a, wt, bias = _operands(lead, k, n, dtype)
    bias = bias if with_bias else None
    args = [cupy.asarray(a), cupy.asarray(wt)] + ([cupy.asarray(bias)] if with_bias else [])
    # the warp kernel where the routing rule gives it the product, else cuBLAS: both must match
    m = int(np.prod(lead, dtype=np.int64))
    outputs = n // 2 if activation == "swiglu" else n
    warps = G.use_warps(m, outputs, G.K.sm_count())
    assert G.GemvNT(cupy, dtype).takes(args[0], args[1], activation == "swiglu") == warps
    run = _op(dtype, activation)
    (got,) = run(*args)
    (again,) = run(*args)
    ref = _reference(a, wt, bias, activation)
    assert got.shape == ref.shape and got.dtype == np.dtype(dtype)
    tol = (2e-3 if dtype == "float16" else 2e-5) * (5 if activation == "swiglu" else 1)
    np.testing.assert_allclose(got.get().astype(np.float64), ref, rtol=tol, atol=tol)
    assert cupy.array_equal(got.view(cupy.uint8), again.view(cupy.uint8))


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_swiglu_epilogue_equals_the_unfused_swiglu_kernel_byte_for_byte(dtype):
    from onnxep.providers.node import NodeInfo, ValueInfo
    from onnxep.providers_cuda.ops import op_onnxep_swiglu
    from onnxep.providers_cuda.xp import cuda_namespace

    a, wt, bias = (cupy.asarray(x) for x in _operands((3,), 896, 2 * 1216, dtype, seed=1))
    (fused,) = _op(dtype, "swiglu")(a, wt, bias)
    (plain,) = _op(dtype)(a, wt, bias)  # the same sums, rounded as the GEMM's output
    info = NodeInfo(
        "SwiGLU",
        "onnxep",
        "s",
        1,
        {},
        (ValueInfo("g", "tensor", np.dtype(dtype)),),
        (ValueInfo("y"),),
    )
    (want,) = op_onnxep_swiglu.swiglu(info, cuda_namespace())(plain)
    assert cupy.array_equal(fused.view(cupy.uint8), want.view(cupy.uint8))


@pytest.mark.parametrize("activation", ["none", "swiglu"])
@pytest.mark.parametrize("lead", [(1,), (16,)], ids=["wide-N", "many-rows"])
def test_products_past_the_rule_run_cublas(lead, activation, monkeypatch):
    from onnxep.providers_cuda.ops import gemv_nt_cuda as G
    from onnxep.providers_cuda.ops.reduce_cuda import sm_count

    def no_gemv(*args, **kw):
        raise AssertionError("the warp kernel ran a product the rule gives to cuBLAS")

    monkeypatch.setattr(G.GemvNT, "__call__", no_gemv)
    outputs = G.MAX_WAVES * sm_count() * G.WARPS_PER_SM + 64 if lead == (1,) else 200
    n = 2 * outputs if activation == "swiglu" else outputs
    a, wt, bias = _operands(lead, 64, n, "float16", seed=2)
    (got,) = _op("float16", activation)(*(cupy.asarray(x) for x in (a, wt, bias)))
    ref = _reference(a, wt, bias, activation)
    np.testing.assert_allclose(got.get().astype(np.float64), ref, rtol=1e-2, atol=1e-2)


def test_gemv_works_inside_stream_capture():
    a, wt, bias = (cupy.asarray(x) for x in _operands((1,), 896, 2 * 4864, "float16", seed=3))
    run = _op("float16", "swiglu")
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        (eager,) = run(a, wt, bias)
        s.synchronize()
        s.begin_capture()
        (out,) = run(a, wt, bias)
        graph = s.end_capture()
        for _ in range(3):
            out.fill(0)
            graph.launch(s)
            s.synchronize()
            assert cupy.array_equal(out.view(cupy.uint16), eager.view(cupy.uint16))


# -------------------------------------------------------- the pass on a genai decoder


@pytest.fixture
def with_pass(monkeypatch):
    """The CUDA plugin's pass list with fuse_transposed_weights last (where it is not yet)."""
    from onnxep.providers.fusions.transposed_weights import FuseTransposedWeights

    real = F.standard_fusions
    if NAME not in {p.name for p in real()}:
        monkeypatch.setattr(F, "standard_fusions", lambda: [*real(), FuseTransposedWeights()])
    return [p.name for p in F.standard_fusions()]


@pytest.fixture(scope="module")
def fp16_decoder(tmp_path_factory) -> str:
    sys.path.insert(0, str(ROOT))  # bench/ is imported from the repo root, not installed
    from bench.factory import build_genai_decoder

    path = tmp_path_factory.mktemp("matmul-nt") / "fp16" / "model.onnx"
    build_genai_decoder("tiny", seed=3, dtype="fp16", out_path=path, symmetric=True)
    return str(path)


@pytest.mark.parametrize("capture", ["off", "auto"])
def test_decoder_tokens_equal_the_unfused_cuda_and_cpu_runs(fp16_decoder, with_pass, capture):
    opts = onnxep.SessionOptions
    cpu = onnxep.InferenceSession(
        fp16_decoder, opts(disabled_rewrites=with_pass), providers=["cpu"]
    )
    want = onnxep.generate(cpu, PROMPT, STEPS, progress=False).tokens
    cuda = [("cuda", {"capture": capture}), "cpu"]
    plain = onnxep.InferenceSession(fp16_decoder, opts(disabled_rewrites=[NAME]), providers=cuda)
    unfused = onnxep.generate(plain, PROMPT, STEPS, progress=False).tokens
    sess = onnxep.InferenceSession(fp16_decoder, providers=cuda)
    (rep,) = [f for f in sess.placement().fusions if f.name == NAME and f.provider == "cuda"]
    assert rep.by_rule == {"matmul_nt": 9, "matmul_nt_swiglu": 2}, rep
    ops = [n.op_type for n in sess.placement() if n.provider == "cuda"]
    assert "MatMulNT" in ops and "SwiGLU" not in ops and "MatMul" not in ops
    got = onnxep.generate(sess, PROMPT, STEPS, progress=False)
    assert got.tokens == unfused == want
    if capture == "auto":
        assert got.capture_stats.get("replays", 0) > 0, got.capture_stats
