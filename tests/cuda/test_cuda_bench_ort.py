"""bench --decode's onnxruntime-gpu sides on the GPU (skipped where onnxruntime has no CUDA
provider: put onnxruntime-gpu first on the path, as bench/gpu_check.sh does when staged).

Both sides decode the factory's tiny fp16 decoder through IO binding with shared KV
buffers, the graph side replaying onnxruntime's CUDA graph, and give onnxep's first tokens
(fp16 on random weights: a near-tie may part the two later).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("cupy", reason="the CUDA tests need CuPy and a GPU")
ort = pytest.importorskip("onnxruntime")
if "CUDAExecutionProvider" not in ort.get_available_providers():
    pytest.skip(
        f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (onnxruntime-gpu is not "
        "on the path)",
        allow_module_level=True,
    )

from onnxep.tools.benchmark import bench  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    sys.path.insert(0, str(ROOT))
    from bench.factory import build_genai_decoder

    path = tmp_path_factory.mktemp("ort") / "fp16" / "model.onnx"
    build_genai_decoder("tiny", seed=2, dtype="fp16", out_path=path)
    return str(path)


def test_onnxruntime_sides_share_their_kv_buffers_and_agree(model):
    res = bench(
        model,
        ["cuda", "cpu"],
        vs=["onnxruntime", "onnxruntime-graph"],
        decode=16,
        context=8,
        warmup=2,
        progress=False,
    )
    assert not res.skipped, res.skipped
    by_name = {s["name"]: s for s in res.sides}
    for name in ("onnxruntime-cuda", "onnxruntime-graph"):
        assert "shared as past and present" in by_name[name]["decode"], by_name[name]
        assert by_name[name]["providers"][0] == "CUDAExecutionProvider"
        # fp16 on random weights: a near-tie may flip late; the first tokens must agree
        assert res.tokens[name][:8] == res.tokens["onnxep"][:8], (name, res.tokens)
        assert name in res.sustained
    assert "CUDA graph" in by_name["onnxruntime-graph"]["decode"]
