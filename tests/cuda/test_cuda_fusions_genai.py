"""The CUDA provider's fusions on genai-format decoders: they fire, and tokens stay the CPU's.

The values after their contrib ops are typed by ``propagate_contrib_dtypes``, so the SiLU
and SwiGLU fusions fire and the gate and up projections (MatMul, or MatMulNBits in int4)
join into the SwiGLU's packed input. Greedy tokens with every fusion on, eager and
captured, equal the CPU provider's with every fusion off. (tests/test_fusions_genai.py runs
the same pass list on the CPU.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import onnxep
from onnxep.providers.fusions import standard_fusions

pytest.importorskip("cupy", reason="the CUDA tests need CuPy and a GPU")

ROOT = Path(__file__).resolve().parents[2]
ALL = [p.name for p in standard_fusions()]
STEPS = 32
PROMPT = np.random.default_rng(9).integers(0, 512, 8)
MLP = {"fuse_silu": 2, "fuse_swiglu": 2, "fuse_shared_input_matmuls": 2}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    sys.path.insert(0, str(ROOT))  # bench/ is imported from the repo root, not installed
    from bench.factory import build_genai_decoder

    out = tmp_path_factory.mktemp("fusions-genai")
    paths = {}
    for name, dtype, symmetric in (
        ("fp16", "fp16", True),
        ("int4", "int4", True),
        ("int4-zp", "int4", False),
    ):
        path = out / name / "model.onnx"
        build_genai_decoder("tiny", seed=3, dtype=dtype, out_path=path, symmetric=symmetric)
        paths[name] = str(path)
    return paths


@pytest.mark.parametrize("capture", ["off", "auto"])
@pytest.mark.parametrize("name", ["fp16", "int4", "int4-zp"])
def test_fusions_fire_and_tokens_equal_the_unfused_cpu_run(models, name, capture):
    cpu = onnxep.InferenceSession(
        models[name], onnxep.SessionOptions(disabled_rewrites=ALL), providers=["cpu"]
    )
    want = onnxep.generate(cpu, PROMPT, STEPS, progress=False).tokens
    sess = onnxep.InferenceSession(models[name], providers=[("cuda", {"capture": capture}), "cpu"])
    fired = {f.name: f.fired for f in sess.placement().fusions if f.provider == "cuda"}
    for pass_name, count in MLP.items():
        assert fired[pass_name] == count, fired
    ops = [n.op_type for n in sess.placement() if n.provider == "cuda"]
    # the SwiGLU is the epilogue of the joined gate/up product (MatMulNT over an fp16 weight,
    # onnxep::MatMulNBits over 4-bit ones), and the norm before it its prologue
    fold = "NormMatMulNT" if name == "fp16" else "NormMatMulNBits"
    assert fold in ops and "SwiGLU" not in ops and "Sigmoid" not in ops
    got = onnxep.generate(sess, PROMPT, STEPS, progress=False)
    assert got.tokens == want
    if capture == "auto":
        assert got.capture_stats.get("replays", 0) > 0, got.capture_stats
