"""bench/gpu_fusions.py's CPU-runnable parts: arguments, the model list, a case on the CPU.

The kernel counts (CUPTI, CUDA graph nodes) need the GPU machine; here the
script runs the same cases on the CPU provider, where it reports none.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench/ is imported from the repo root, not installed
from bench import gpu_fusions  # noqa: E402

GENAI_INT4 = ROOT / "tests" / "data" / "genai" / "qwen2_int4" / "model.onnx"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["o.json", "--providers", ""], "--providers names no provider"),
        (["o.json", "--steps", "0"], "--steps must be at least 1"),
        (["o.json", "--prompt", "0"], "--prompt must be at least 1"),
        (["o.json", "--captures", "sometimes"], "unknown mode(s) ['sometimes']"),
        (["o.json", "--providers", "cpu", "--captures", "auto"], "needs the cuda provider"),
    ],
)
def test_bad_arguments_say_what_is_wrong(argv, message, capsys):
    with pytest.raises(SystemExit):
        gpu_fusions.parse_args(argv)
    assert message in capsys.readouterr().err


def test_capture_modes_default_by_provider():
    assert gpu_fusions.parse_args(["o.json"]).captures == ["off", "auto"]
    assert gpu_fusions.parse_args(["o.json", "--providers", "cpu"]).captures == ["off"]


def test_absent_qwen_decoders_are_replaced_by_tiny_ones(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_fusions, "QWEN", tmp_path / "nothing-here")
    found, notes = gpu_fusions.models(gpu_fusions.parse_args(["o.json"]), tmp_path)
    names = [name for name, _ in found]
    assert names == ["hf_llama_kv", "llama_kv", "genai-tiny-fp16", "genai-tiny-int4"]
    assert all(path.exists() for _, path in found)
    assert len(notes) == 2 and all("absent" in n for n in notes)


def test_a_cpu_run_writes_every_case_with_its_figures(tmp_path, capsys):
    out = tmp_path / "fusions.json"
    argv = [str(out), "--providers", "cpu", "--steps", "2", "--models", str(GENAI_INT4)]
    assert gpu_fusions.main(argv) == 0
    (case,) = json.loads(out.read_text())["cases"]
    assert case["model"] == "qwen2_int4" and case["capture"] == "off"
    assert case["tokens_agree"] and case["first_divergence"] is None
    for side in ("off", "on"):
        fig = case[side]
        assert fig["timed_steps"] == 2 and fig["ms_per_step"] > 0
        assert fig["kernels_per_step"] is None and fig["kernels_counted"] == "no CUDA provider"
        assert len(fig["tokens"]) == 1 + gpu_fusions.SETTLE + 2
    assert case["off"]["fired"] == {}  # every fusion off
    printed = capsys.readouterr().out
    assert '"model": "qwen2_int4"' in printed and "# qwen2_int4 off:" in printed


def test_budget_spent_skips_the_remaining_cases(tmp_path):
    out = tmp_path / "fusions.json"
    argv = [str(out), "--providers", "cpu", "--budget", "0", "--models", str(GENAI_INT4)]
    assert gpu_fusions.main(argv) == 0
    (case,) = json.loads(out.read_text())["cases"]
    assert case["skipped"] == "budget spent"
