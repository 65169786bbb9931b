"""The benchmark harness works on tiny models (it is never a timed assert)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from onnxep.tools.benchmark import bench
from onnxep.tools.cli import bundled_model

DATA = Path(__file__).parent / "data"
pytest.importorskip("onnxruntime")


def test_latency_mode_against_peers(tmp_path):
    out = tmp_path / "r.json"
    res = bench(
        str(bundled_model()),
        vs=["onnxruntime", "reference"],
        runs=3,
        warmup=1,
        json_path=str(out),
        progress=False,
    )
    assert set(res.summary) == {"onnxep", "onnxruntime", "reference"}
    data = json.loads(out.read_text())
    assert len(data["samples_ms"]["onnxep"]) == 3
    assert len(data["samples_ms"]["reference"]) == 3
    assert data["ratios_vs_onnxep"]["onnxep"] == 1.0
    assert "cpu" in data["machine"]
    table = res.table()
    assert "onnxruntime" in table and "vs onnxep" in table


def test_decode_mode_drives_the_cache():
    res = bench(
        str(DATA / "llama_kv.onnx"),
        ["cpu"],  # one device: any provider installed here would add copies to count
        vs=["onnxruntime"],
        decode=3,
        context=4,
        warmup=1,
        progress=False,
    )
    assert res.mode == "decode"
    assert len(res.samples["onnxep"]) == 3
    assert res.tokens["onnxep"] == res.tokens["onnxruntime"]
    assert "tok/s" in res.table()
    ours = res.sides[0]
    assert ours["device_to_host_copies"] == 0
    # each side also decodes alone, its steps back to back, synced once at the end
    assert set(res.sustained) == {"onnxep", "onnxruntime"} and min(res.sustained.values()) > 0
    assert not [k for k in res.skipped if "back to back" in k], res.skipped
    assert "back to back" in res.table()
    assert res.to_json()["sustained_ms_per_step"] == res.sustained


def test_profile_lists_top_ops():
    res = bench(str(bundled_model()), vs=[], runs=2, warmup=1, profile=True, progress=False)
    ops = {row[0] for row in res.profile_top}
    assert ops & {"Conv", "FusedConv"}  # the CPU provider fuses Conv + Relu
    assert "top ops by time" in res.table()


def test_unusable_peer_is_reported_not_fatal():
    res = bench(str(bundled_model()), vs=["torch"], runs=2, warmup=1, progress=False)
    assert "torch" in res.skipped
    assert "onnxep" in res.summary


def test_plot_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "bench.png"
    bench(str(bundled_model()), vs=["onnxruntime"], runs=2, warmup=1, plot=str(png), progress=False)
    assert png.stat().st_size > 1000


def test_cli_bench_prints_table(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "r.json"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "onnxep.tools.cli",
            "bench",
            str(bundled_model()),
            "--vs",
            "onnxruntime",
            "--runs",
            "3",
            "--warmup",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert "median ms" in res.stdout and "onnxruntime" in res.stdout
    assert json.loads(out.read_text())["samples_ms"]["onnxep"]


GENAI = DATA / "genai"


def test_onnxruntime_decodes_on_kv_buffers_shared_as_past_and_present():
    """onnxruntime's side binds each cache once, as GroupQueryAttention shares it (the
    onnxruntime-genai way); its tokens are onnxep's."""
    res = bench(
        str(GENAI / "qwen2_fp32" / "model.onnx"),
        ["cpu"],
        vs=["onnxruntime"],
        decode=4,
        context=6,
        warmup=1,
        progress=False,
    )
    (ort,) = [s for s in res.sides if s["name"] == "onnxruntime"]
    assert "shared as past and present" in ort["decode"], ort
    assert res.tokens["onnxruntime"] == res.tokens["onnxep"]
    assert "onnxruntime" in res.sustained


def test_onnxruntime_decode_loops_of_one_side_bind_the_same_buffers():
    """A graph captured in the warm-up loop replays the addresses it was captured with, so
    the timed loop must bind the very same buffers (zeroed), or it reads stale ones."""
    import numpy as np

    from onnxep.generation.spec import decode_spec, model_dims
    from onnxep.tools.benchmark.sides import make_peer

    path = str(GENAI / "qwen2_fp32" / "model.onnx")
    side = make_peer("onnxruntime", path, want_cuda=False)
    side.decode_capacity = 16
    spec = decode_spec(side.session.get_inputs(), side.session.get_outputs())
    dims = model_dims(path)
    prompt = np.array([[1, 2, 3, 4]], np.int64)

    def decode(steps):
        loop = side.decode_loop(spec, prompt, steps, dims, [])
        while not loop.done:
            loop.step()
        return loop

    first, second = decode(3), decode(3)
    assert second.tokens == first.tokens  # the reused caches were zeroed between loops
    assert {k: v.data_ptr() for k, v in first.buffers.items()} == {
        k: v.data_ptr() for k, v in second.buffers.items()
    }


def test_onnxruntime_on_a_growing_cache_takes_host_feeds_and_its_graph_is_skipped():
    res = bench(
        str(DATA / "llama_kv.onnx"),  # present = Concat(past, new): nothing to share
        ["cpu"],
        vs=["onnxruntime", "onnxruntime-graph"],
        decode=2,
        context=4,
        warmup=1,
        progress=False,
    )
    (ort,) = [s for s in res.sides if s["name"] == "onnxruntime"]
    assert "decode" not in ort and res.tokens["onnxruntime"] == res.tokens["onnxep"]
    # the graph side needs onnxruntime's CUDA provider (onnxruntime-gpu), and says so
    assert "onnxruntime-gpu" in res.skipped["onnxruntime-graph"]
