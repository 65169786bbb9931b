"""onnxruntime-genai builder exports (tests/data/genai) decode the same greedy tokens.

Qwen2 exports (fp32, int4 MatMulNBits) are checked against onnxruntime step by
step with the KV cache; the Qwen3.5 hybrid export (which onnxruntime cannot
run) against transformers' own forward pass, recorded by make_genai_models.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import onnxep
from onnxep.generation.spec import DecodeState, decode_spec, model_dims

DATA = Path(__file__).parent / "data" / "genai"
STEPS = 16


def greedy(run, sess, prompt, steps=STEPS):
    spec = decode_spec(sess.get_inputs(), sess.get_outputs())
    names = [o.name for o in sess.get_outputs()]
    dims = model_dims(sess.model_path)
    state = DecodeState(spec, len(prompt), prompt=np.array(prompt), dims=dims)
    for _ in range(steps):
        state.advance(dict(zip(names, run(state.feeds()))))
    return state.tokens


@pytest.mark.parametrize("name", ["qwen2_fp32", "qwen2_int4"])
def test_qwen2_builder_export_matches_onnxruntime(name):
    ort = pytest.importorskip("onnxruntime")
    path = str(DATA / name / "model.onnx")
    ours = onnxep.InferenceSession(path, providers=["cpu"])
    theirs = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    prompt = list(np.random.default_rng(3).integers(0, 512, 8))
    got = greedy(lambda f: ours.run(None, f), ours, prompt)
    want = greedy(lambda f: theirs.run(None, f), ours, prompt)
    assert got == want


def test_qwen2_logits_match_onnxruntime_per_step():
    ort = pytest.importorskip("onnxruntime")
    path = str(DATA / "qwen2_fp32" / "model.onnx")
    ours = onnxep.InferenceSession(path, providers=["cpu"])
    theirs = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    spec = decode_spec(ours.get_inputs(), ours.get_outputs())
    names = [o.name for o in ours.get_outputs()]
    state = DecodeState(spec, 8, seed=5, dims=model_dims(path))
    for _ in range(4):
        feeds = state.feeds()
        a, b = ours.run(None, feeds), theirs.run(None, feeds)
        for n, x, y in zip(names, a, b):
            np.testing.assert_allclose(x, y, rtol=1e-3, atol=1e-4, err_msg=n)
        state.advance(dict(zip(names, b)))


def test_qwen3_5_hybrid_export_matches_transformers_tokens():
    ref = json.loads((DATA / "qwen3_5_tokens.json").read_text())
    sess = onnxep.InferenceSession(str(DATA / "qwen3_5_fp32" / "model.onnx"), providers=["cpu"])
    ops = {n.op_type for n in sess.placement()}
    assert {"LinearAttention", "CausalConvWithState", "GroupQueryAttention"} <= ops
    got = greedy(lambda f: sess.run(None, f), sess, ref["prompt"], steps=len(ref["tokens"]))
    assert got == ref["tokens"]
