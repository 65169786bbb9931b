"""The fusions on the standard-op decoders torch exported (tests/data) and the factory's BERT.

On the ``fusions`` provider (the CUDA provider's pass list over the generic kernels) the
placement report and ``onnxep explain`` show which fusions fired, and the fused session
gives the unfused one's outputs within float32 tolerance.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import exported_feeds
from test_fusions_pattern import ALL, NAME, fusion, fusions_provider, session

from onnxep.testing import TOLERANCES

DATA = Path(__file__).parent / "data"
ATOL, RTOL = TOLERANCES[np.dtype(np.float32)]

DIMS = {"batch": 2, "seq": 3, "past": 4, "total": 7, "sequence": 5}
#: Fires per pass on the torch-exported LLaMA decoders (2 layers): an RMS norm before each
#: attention and MLP and one at the end, the residual Add before all but the first as its
#: skip, one SiLU-gated MLP per layer, Q/K/V and gate/up joined per layer.
DECODER = {
    "fuse_rms_norm": 5,
    "fuse_skip_rms_norm": 4,
    "fuse_silu": 2,
    "fuse_swiglu": 2,
    "fuse_shared_input_matmuls": 4,
    # every norm into the joined Q/K/V, gate/up or LM-head product reading it
    "fuse_norm_matmul": 5,
}
#: The opset-23 export writes RMSNormalization itself: only its skip variant is left to fuse
#: (and to fold into its product: ONNX's RMSNormalization is not a norm fuse_norm_matmul takes).
DECODER_23 = {**DECODER, "fuse_rms_norm": 0, "fuse_norm_matmul": 4}
MODELS = {
    "hf_llama.onnx": DECODER,
    "hf_llama_kv.onnx": DECODER,
    "llama_kv.onnx": DECODER,
    "llama_kv_opset23.onnx": DECODER_23,
}


@pytest.fixture(scope="module")
def make():
    with fusions_provider() as register:
        yield register()


def fused_matches_unfused(path, make, fired):
    fused = session(str(path), make)
    for name, count in fired.items():
        assert fusion(fused, name).fired == count, fused.placement().format(max_nodes=0)
    plain = session(str(path), make, off=ALL)
    feeds = exported_feeds(fused, DIMS, np.random.default_rng(0), vocab=200)
    for arg, a, b in zip(fused.get_outputs(), fused.run(None, feeds), plain.run(None, feeds)):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=arg.name)
    assert len(fused.placement()) < len(plain.placement())
    return fused


@pytest.mark.parametrize("name", sorted(MODELS))
def test_decoder_fusions_fire_and_match(make, name):
    sess = fused_matches_unfused(DATA / name, make, MODELS[name])
    ops = {(n.domain, n.op_type) for n in sess.placement()}
    # each (skip) norm then folded into the joined product reading it
    assert ("com.microsoft", "SkipSimplifiedLayerNormalization") not in ops
    # packed (its gate and up came from one MatMul), then folded into that product's epilogue
    assert fusion(sess, "fuse_swiglu").fired > 0 and ("onnxep", "SwiGLU") not in ops
    assert ("onnxep", "MatMulNT") in ops and ("onnxep", "NormMatMulNT") in ops


def test_explain_shows_the_decoder_fusions(make, capsys):
    from onnxep.tools.cli import main

    assert main(["explain", str(DATA / "llama_kv.onnx"), "--providers", NAME]) == 0
    out = capsys.readouterr().out
    for name, count in DECODER.items():
        assert f"{NAME}/{name}: fired {count}" in out


def test_cpu_provider_fuses_the_decoders_rms_norms():
    sess = session(str(DATA / "hf_llama.onnx"), "cpu")
    assert fusion(sess, "fuse_rms_norm", "cpu").fired == 5
    assert [n.op_type for n in sess.placement()].count("SimplifiedLayerNormalization") == 5


@pytest.mark.slow
def test_factory_bert_export_fuses_gelu_and_biases(make, tmp_path):
    pytest.importorskip("torch")
    from bench.factory.torch_models import export_bert

    path = tmp_path / "bert.onnx"
    export_bert(path, vocab=256, hidden=64, layers=2, heads=2, inter=128, max_positions=64)
    fired = {
        "fuse_gelu": 2,  # the erf GELU of each layer's FFN
        "fuse_bias_gelu": 2,  # with the up projection's bias
        "fuse_matmul_bias": 10,  # Q, K, V, output and down projections
        "fuse_shared_input_matmuls": 2,  # Q, K and V joined, biases too
    }
    fused_matches_unfused(path, make, fired)
