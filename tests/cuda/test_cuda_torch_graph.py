"""The torch-graph peer on the GPU: its captured decode step gives the eager static step's
tokens, captures once and replays every later step, for the genai decoder and the hybrid.

(The static-cache step itself is checked against the concatenating peer on the CPU, in
tests/test_bench_torch_graph.py.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = 24
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("torch here has no CUDA device", allow_module_level=True)


@pytest.fixture(scope="module", params=["genai-fp16", "genai-int4", "hybrid-fp32"])
def model(request, tmp_path_factory) -> str:
    sys.path.insert(0, str(ROOT))  # bench/ is imported from the repo root, not installed
    from bench.factory import build_genai_decoder, build_hybrid_decoder

    kind, dtype = request.param.split("-")
    path = tmp_path_factory.mktemp(request.param) / "model.onnx"
    build = build_genai_decoder if kind == "genai" else build_hybrid_decoder
    build("tiny", seed=1, dtype=dtype, out_path=path)
    return str(path)


def test_captured_step_replays_the_eager_static_steps_tokens(model):
    from onnxep.tools.benchmark.torch_peer import load_torch_peer
    from onnxep.tools.benchmark.torch_static import StaticDecoder

    peer = load_torch_peer(model, "cuda")
    prompt = np.random.default_rng(5).integers(0, 512, (1, 8))
    eager = StaticDecoder(peer, prompt, STEPS, graph=False)
    graph = StaticDecoder(peer, prompt, STEPS, graph=True)
    while not eager.done:
        eager.step()
        graph.step()
    c = graph.counters()
    assert c["failures"] == [] and c["fallbacks"] == 0, c
    assert (c["captures"], c["replays"]) == (1, STEPS - 1), c
    first = next((i for i, (a, b) in enumerate(zip(graph.tokens, eager.tokens)) if a != b), None)
    assert first is None, f"graph and eager part at token {first}: {graph.tokens} {eager.tokens}"


def test_bench_reports_the_torch_graph_side(model):
    from onnxep.tools.benchmark import bench

    res = bench(
        model,
        ["cuda", "cpu"],
        vs=["torch", "torch-graph"],
        decode=8,
        context=8,
        warmup=1,
        progress=False,
    )
    assert "torch-graph" not in res.skipped, res.skipped
    side = next(s for s in res.sides if s["name"] == "torch-graph")
    c = side["capture_timed"]
    assert (c["captures"], c["replays"], c["fallbacks"]) == (1, 8, 0), c
    assert len(res.tokens["torch-graph"]) == 9
    assert "torch-graph capture: whole, timed decode: captures 1, replays 8" in res.table()
