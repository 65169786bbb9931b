"""The CUDA provider's fusions on the GPU: each fused graph against the same graph with that
fusion switched off, both on ``["cuda"]`` alone.

Exact fusions (Rsqrt, SiLU, SwiGLU) must give the unfused CUDA kernels' bytes; the others
must agree within the dtype's tolerance. The small graphs are tests/test_fusions_graphs.py's,
which test_fusions_ops.py runs on the CPU reference, and the torch-exported decoders are
checked end to end. The kernels' arithmetic is also run on the CPU emulator
(tests/test_fusions_cuda_emulated.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import onnxep
from onnxep.providers.fusions import standard_fusions

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

import test_fusions_graphs as G  # noqa: E402

pytest.importorskip("cupy", reason="the CUDA tests need CuPy and a GPU")

ALL = [p.name for p in standard_fusions()]
F32, F16 = G.F32, G.F16

#: id -> (model, pass, fused op, exact)
CASES = {
    "rms-f32": (lambda: G.rms_model(), "fuse_rms_norm", "SimplifiedLayerNormalization", False),
    "rms-f16": (lambda: G.rms_model(F16), "fuse_rms_norm", "SimplifiedLayerNormalization", False),
    "rms-f16-cast": (
        lambda: G.rms_model(F16, cast=True),
        "fuse_rms_norm",
        "SimplifiedLayerNormalization",
        False,
    ),
    "skip-f32": (
        lambda: G.skip_model(),
        "fuse_skip_rms_norm",
        "SkipSimplifiedLayerNormalization",
        False,
    ),
    "skip-f16": (
        lambda: G.skip_model(F16),
        "fuse_skip_rms_norm",
        "SkipSimplifiedLayerNormalization",
        False,
    ),
    "skip-23": (
        lambda: G.skip_model(opset23=True),
        "fuse_skip_rms_norm",
        "SkipSimplifiedLayerNormalization",
        False,
    ),
    "rsqrt-f32": (lambda: G.rsqrt_model(), "fuse_rsqrt", "Rsqrt", True),
    "rsqrt-f16-div": (lambda: G.rsqrt_model(F16, div=True), "fuse_rsqrt", "Rsqrt", True),
    "silu-f32": (lambda: G.silu_model(), "fuse_silu", "SiLU", True),
    "silu-f16": (lambda: G.silu_model(F16, swapped=True), "fuse_silu", "SiLU", True),
    "swiglu-f32": (lambda: G.swiglu_model(), "fuse_swiglu", "SwiGLU", True),
    "swiglu-f16": (lambda: G.swiglu_model(F16), "fuse_swiglu", "SwiGLU", True),
    "gelu-erf-f32": (lambda: G.gelu_model(), "fuse_gelu", "Gelu", False),
    "gelu-tanh-f16": (lambda: G.gelu_model(F16, "tanh"), "fuse_gelu", "FastGelu", False),
    "bias-gelu-f32": (lambda: G.gelu_model(bias=True), "fuse_bias_gelu", "BiasGelu", False),
    "bias-gelu-tanh-f16": (
        lambda: G.gelu_model(F16, "tanh", bias=True, opset=20),
        "fuse_bias_gelu",
        "FastGelu",
        False,
    ),
    "matmul-bias-f32": (lambda: G.matmul_bias_model(), "fuse_matmul_bias", "MatMulBias", False),
    "matmul-bias-f16": (lambda: G.matmul_bias_model(F16), "fuse_matmul_bias", "MatMulBias", False),
    "qkv-f32": (lambda: G.shared_model(), "fuse_shared_input_matmuls", "Split", False),
    "gate-up-f16": (
        lambda: G.shared_model((16, 16), F16, swiglu=True),
        "fuse_shared_input_matmuls",
        "SwiGLU",
        False,
    ),
}


def _session(model, off=()):
    opts = onnxep.SessionOptions(disable_fallback=True, disabled_rewrites=list(off))
    return onnxep.InferenceSession(model, opts, providers=["cuda"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_matches_unfused_on_cuda(case):
    make, name, op, exact = CASES[case]
    model = make()
    # the weight transpose (last pass; tests/cuda/test_cuda_matmul_nt.py) would take the
    # MatMuls these passes leave, so it stays off here
    last = "fuse_transposed_weights"
    fused, plain = _session(model, off=[last]), _session(model, off=[name, last])
    (rep,) = [f for f in fused.placement().fusions if f.name == name and f.provider == "cuda"]
    assert rep.fired >= 1, fused.placement().format()
    assert op in [n.op_type for n in fused.placement() if n.provider == "cuda"]
    inputs = G.positive(model) if case.startswith("rsqrt") else G.feeds(model)
    names = [o.name for o in model.graph.output]
    for n, got, want in zip(names, fused.run(None, inputs), plain.run(None, inputs)):
        G.assert_like_unfused(got, want, exact, f"{case}:{n}")


DECODERS = ["hf_llama.onnx", "hf_llama_kv.onnx", "llama_kv.onnx", "llama_kv_opset23.onnx"]
DIMS = {"batch": 2, "seq": 3, "past": 4, "total": 7}


@pytest.mark.parametrize("name", DECODERS)
def test_decoders_fused_match_unfused_on_cuda(name):
    path = str(TESTS / "data" / name)
    fused, plain = _session(path), _session(path, off=ALL)
    fired = {f.name: f.fired for f in fused.placement().fusions if f.provider == "cuda"}
    assert fired["fuse_skip_rms_norm"] > 0 and fired["fuse_swiglu"] > 0, fired
    rng = np.random.default_rng(0)
    feeds = {}
    for arg in fused.get_inputs():
        shape = [d if isinstance(d, int) else DIMS[d] for d in arg.shape]
        if "mask" in arg.name:
            feeds[arg.name] = np.ones(shape, np.int64)
        elif arg.type == "tensor(int64)":
            feeds[arg.name] = rng.integers(0, 200, shape).astype(np.int64)
        else:
            feeds[arg.name] = rng.standard_normal(shape).astype(np.float32)
    for arg, got, want in zip(fused.get_outputs(), fused.run(None, feeds), plain.run(None, feeds)):
        G.assert_like_unfused(got, want, False, f"{name}:{arg.name}")
