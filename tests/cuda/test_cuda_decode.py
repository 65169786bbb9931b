"""Greedy decode on CUDA: the CPU provider's tokens, every compute node on CUDA, one read a step.

Models: the factory's tiny genai decoder in fp16 and int4 and its tiny
hybrid (built into a temporary folder), and the onnxruntime-genai builder
exports in tests/data/genai. Each check is its own test, and each failure
message says what to fix (the nodes left on the CPU with their decline
reasons, the step where the tokens part, the copies that read the device).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import onnxep
from onnxep.generation.greedy import SHARED
from onnxep.generation.spec import decode_spec

ROOT = Path(__file__).resolve().parents[2]
GENAI = ROOT / "tests" / "data" / "genai"
STEPS = 32
PROMPT = np.random.default_rng(7).integers(0, 512, 8)  # every model here has 512 tokens
CASES = [
    "factory-genai-fp16",
    "factory-genai-int4",
    "factory-hybrid",
    "qwen2_fp32",
    "qwen2_int4",
    "qwen3_5_fp32",
]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    sys.path.insert(0, str(ROOT))  # bench/ is imported from the repo root, not installed
    from bench.factory import build_genai_decoder, build_hybrid_decoder

    out = tmp_path_factory.mktemp("decode")
    paths = {name: str(GENAI / name / "model.onnx") for name in CASES if (GENAI / name).is_dir()}
    for dtype in ("fp16", "int4"):
        path = out / f"genai-{dtype}" / "model.onnx"
        build_genai_decoder("tiny", seed=1, dtype=dtype, out_path=path)
        paths[f"factory-genai-{dtype}"] = str(path)
    path = out / "hybrid" / "model.onnx"
    build_hybrid_decoder("tiny", seed=1, out_path=path)
    paths["factory-hybrid"] = str(path)
    return paths


@pytest.fixture(scope="module")
def sessions(models):
    cache: dict[str, onnxep.InferenceSession] = {}

    def get(name: str) -> onnxep.InferenceSession:
        if name not in cache:
            cache[name] = onnxep.InferenceSession(models[name], providers=["cuda", "cpu"])
        return cache[name]

    return get


@pytest.mark.parametrize("name", CASES)
def test_every_compute_node_runs_on_cuda(name, sessions):
    sess = sessions(name)
    off = [n for n in sess.placement() if n.role == "compute" and n.provider != "cuda"]
    for n in off:
        op = f"{n.domain or 'ai.onnx'}::{n.op_type}"
        print(f"{name}: {n.node} ({op}) on {n.provider}: {n.declined}")
    assert not off, f"{len(off)} compute node(s) off CUDA: " + "; ".join(
        f"{n.op_type} {n.node!r}: {n.declined}" for n in off
    )


@pytest.mark.parametrize("name", CASES)
def test_greedy_tokens_equal_the_cpu_providers(name, models, sessions):
    cpu = onnxep.InferenceSession(models[name], providers=["cpu"])
    want = onnxep.generate(cpu, PROMPT, STEPS, progress=False).tokens
    got = onnxep.generate(sessions(name), PROMPT, STEPS, progress=False)
    first = next((i for i, (a, b) in enumerate(zip(got.tokens, want)) if a != b), None)
    assert first is None, (
        f"{name}: CUDA and CPU part at token {first} of {STEPS}: cuda {got.tokens} vs cpu {want}"
    )


@pytest.mark.parametrize("name", CASES)
def test_a_step_shares_the_cache_and_reads_only_the_token(name, sessions):
    sess = sessions(name)
    res = onnxep.generate(sess, PROMPT, STEPS, progress=False)
    print(f"{name}: {res.summary()}")
    assert res.state_path == SHARED, f"{name}: {res.state_note}"
    assert res.full_mask, f"{name}: decode steps should feed the mask at full capacity"
    reads = res.device_to_host_reads
    host_reads = [c for c in sess.placement().copies if c.dst == "cpu"]
    assert reads == [1] * STEPS, (
        f"{name}: device-to-host reads per run {reads} (want 1, the token ids); the plan's "
        "copies to the host: "
        + ("; ".join(f"{c.value} -> {c.consumer}" for c in host_reads) or "none")
    )
    assert res.copied_outputs == [0] * STEPS, (
        f"{name}: outputs copied into their bound buffers per run {res.copied_outputs}: the "
        "present cache should be the past buffer, written in place"
    )
    # with capture on, the graph reads and writes the bound caches in place too: its
    # replays copy only the host feeds, never a cache
    spec = decode_spec(sess.get_inputs(), sess.get_outputs())
    host_feeds = len(sess.get_inputs()) - sum(1 for s in spec.states if s.grow_axis is not None)
    c = res.capture_stats
    assert c["copies"] <= c["replays"] * host_feeds, (
        f"{name}: captured replays made {c['copies']} copies over {c['replays']} replays; "
        f"at most {host_feeds} per replay (the host feeds) when no cache is copied"
    )
