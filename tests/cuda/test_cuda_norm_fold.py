"""fuse_norm_matmul and fuse_quantized_swiglu on the GPU: one launch, the unfused kernels' bits.

Both passes are exact on CUDA: a norm folded into the GEMV reading it normalises in the
GEMV's prologue as ``norm_rows`` does, and a SwiGLU folded into its joined MatMulNBits
rounds as ``swiglu_k`` does. So on the factory's tiny decoders (fp16; int4 with float32
activations at accuracy_level 4, with and without zero points) the logits of a session with
the folds equal, byte for byte, those of the same session without them, eager and
captured, and the greedy tokens agree for 32 steps; a norm and its GEMV at the Qwen2.5
decode shapes (one row and eight) give the unfused nodes' bytes; the normalising
instantiations are the ones that ran. The emulator tests
(tests/test_norm_prologue_cuda_emulated.py, tests/test_norm_matmul_cuda_emulated.py) check
the same on the CPU.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import onnxep

cupy = pytest.importorskip("cupy", reason="the CUDA tests need CuPy and a GPU")

TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent
sys.path.insert(0, str(TESTS))
from test_fusions_norm_matmul import norm_gemv_model  # noqa: E402

FOLDS = ["fuse_norm_matmul", "fuse_quantized_swiglu"]
STEPS = 32
PROMPT = np.random.default_rng(9).integers(0, 512, 8)  # eight rows: still the GEMVs


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    sys.path.insert(0, str(ROOT))  # bench/ is imported from the repo root, not installed
    from bench.factory import build_genai_decoder

    out = tmp_path_factory.mktemp("norm-fold")
    paths = {}
    for name, dtype, symmetric in (
        ("fp16", "fp16", True),
        ("int4", "int4", True),
        ("int4-zp", "int4", False),
    ):
        path = out / name / "model.onnx"
        build_genai_decoder("tiny", seed=5, dtype=dtype, out_path=path, symmetric=symmetric)
        paths[name] = str(path)
    return paths


@pytest.fixture
def normalising(monkeypatch):
    """Calls of the GEMVs with a norm in their prologue."""
    from onnxep.providers_cuda.ops import gemv_nt_cuda as G
    from onnxep.providers_cuda.ops import nbits_mma_cuda as M

    seen = []
    for cls in (G.GemvNT, M.NbitsMma):
        real = cls.__call__

        def call(self, *args, _real=real, **kw):
            if self.norm:  # built for the normalising instantiations only
                seen.append(type(self).__name__)
            return _real(self, *args, **kw)

        monkeypatch.setattr(cls, "__call__", call)
    return seen


def _session(path, capture="off", off=()):
    opts = onnxep.SessionOptions(disabled_rewrites=list(off))
    return onnxep.InferenceSession(path, opts, providers=[("cuda", {"capture": capture}), "cpu"])


def _prefill_logits(sess):
    feeds = {}
    for arg in sess.get_inputs():
        if arg.name == "input_ids":
            feeds[arg.name] = PROMPT[None].astype(np.int64)
        elif arg.name == "attention_mask":
            feeds[arg.name] = np.ones((1, len(PROMPT)), np.int64)
        else:
            shape = [1 if d == "batch_size" else 0 if isinstance(d, str) else d for d in arg.shape]
            feeds[arg.name] = np.zeros(shape, np.float16 if "float16" in arg.type else np.float32)
    return sess.run(["logits"], feeds)[0]


@pytest.mark.parametrize("name", ["fp16", "int4", "int4-zp"])
def test_folds_give_the_unfused_kernels_bits(models, name, normalising):
    fused, plain = _session(models[name]), _session(models[name], off=FOLDS)
    fired = {f.name: f.fired for f in fused.placement().fusions if f.provider == "cuda"}
    assert fired["fuse_norm_matmul"] == 5, fired  # two layers' two norms and the final one
    assert fired["fuse_quantized_swiglu"] == (0 if name == "fp16" else 2), fired
    ops = [n.op_type for n in fused.placement() if n.provider == "cuda"]
    assert "SkipSimplifiedLayerNormalization" not in ops and "SwiGLU" not in ops
    got = _prefill_logits(fused)
    assert len(normalising) == 5, normalising
    normalising.clear()
    want = _prefill_logits(plain)
    assert not normalising
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("capture", ["off", "auto"])
@pytest.mark.parametrize("name", ["fp16", "int4", "int4-zp"])
def test_greedy_tokens_with_and_without_the_folds(models, name, capture):
    fused = onnxep.generate(_session(models[name], capture), PROMPT, STEPS, progress=False)
    plain = _session(models[name], capture, off=FOLDS)
    assert fused.tokens == onnxep.generate(plain, PROMPT, STEPS, progress=False).tokens
    if capture == "auto":
        assert fused.capture_stats.get("replays", 0) > 0, fused.capture_stats


#: (K, N) of Qwen2.5-0.5B's and 1.5B's normalised products: joined Q/K/V, joined gate/up.
SHAPES = [(896, 1152), (896, 9728), (1536, 2048), (1536, 17920)]


@pytest.mark.parametrize("rows", [(1, 1), (1, 8)], ids=["1-row", "8-rows"])
@pytest.mark.parametrize(("d", "n"), SHAPES)
@pytest.mark.parametrize(
    "kind", ["fp16-matmul", "fp16-nbits-swiglu", "fp32-nbits-level4-swiglu", "fp32-matmul"]
)
def test_norm_and_gemv_at_decode_shapes(kind, d, n, rows, normalising):
    dt = np.float32 if kind.startswith("fp32") else np.float16
    gemv = "nbits" if "nbits" in kind else "matmul"
    model = norm_gemv_model(
        dt, gemv=gemv, swiglu="swiglu" in kind, d=d, n=n, rows=rows,
        level=4 if "level4" in kind else 0,
    )  # fmt: skip
    rng = np.random.default_rng(1)
    feeds = {
        v.name: rng.standard_normal([x.dim_value for x in v.type.tensor_type.shape.dim]).astype(dt)
        for v in model.graph.input
    }
    fused = _session(model.SerializeToString())
    plain = _session(model.SerializeToString(), off=FOLDS)
    got = fused.run(None, feeds)
    # one launch wherever the GEMV the unfused node runs takes these rows (else both sessions
    # run the norm's kernel and cuBLAS)
    assert bool(normalising) == _one_launch(gemv, rows[1], d, n, dt, "swiglu" in kind)
    for g, w in zip(got, plain.run(None, feeds)):
        assert np.array_equal(g.view(np.uint8), w.view(np.uint8))


def _one_launch(gemv, m, d, n, dt, swiglu):
    from onnxep.providers_cuda.ops import gemv_nt_cuda as G
    from onnxep.providers_cuda.ops import nbits_mma_cuda as M
    from onnxep.providers_cuda.ops.attention_cuda import sm_count

    if gemv == "nbits":
        return M.fits(m, -(-d // 32), -(-d // 32) if dt == np.float32 else 0)
    return G.use_warps(m, n // 2 if swiglu else n, sm_count()) and G.norm_fits(m, d, dt)
