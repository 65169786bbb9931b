"""bench's second onnxep side (CUDA-graph capture) and the capture counters of a decode."""

from __future__ import annotations

from pathlib import Path

from onnxep.tools.benchmark import bench

DATA = Path(__file__).parent / "data"


def test_graph_side_needs_cuda_and_decode_records_capture_counters():
    res = bench(
        str(DATA / "llama_kv.onnx"),
        ["cpu"],
        vs=["onnxep-graph"],
        decode=2,
        context=4,
        warmup=1,
        progress=False,
    )
    assert "CUDA" in res.skipped["onnxep-graph"] and "onnxep" in res.summary
    ours = res.sides[0]
    assert ours["capture_timed"]["replays"] == 0 and ours["capture_timed"]["policy"] == "off"
    assert "onnxep capture: off, timed decode: captures 0, replays 0" in res.table()


def test_graph_side_providers_set_capture_on_cuda_entries_only():
    from onnxep.tools.benchmark.sides import with_capture

    assert with_capture(["cuda", "cpu"], "auto") == [("cuda", {"capture": "auto"}), "cpu"]
    assert with_capture(None, "off") is None
