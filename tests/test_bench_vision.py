"""bench/gpu_vision.py's models and its table, on the CPU (the GPU machine runs the real thing).

Each model the benchmark exports (the factory's ResNet-50-sized classifier and YOLO-style
detector included) must be a valid export that onnxep's CPU provider runs as onnxruntime
does, at a reduced input size; and the script's own loop, on ``--providers cpu`` without
onnxruntime-gpu, must print its rows and say that onnxep was timed alone.
"""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest

import onnxep
from bench import gpu_vision as V

SMALL = {"resnet-small": (3, 32, 32), "resnet50": (3, 64, 64), "yolo": (3, 128, 128)}
SMALL["vad"] = (1, 4000)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_each_model_exports_and_matches_onnxruntime(name, monkeypatch):
    make, _, input_name, batches = V.MODELS[name]
    monkeypatch.setitem(V.MODELS, name, (make, SMALL[name], input_name, batches))
    model, feeds = V.export(name, 1, "fp32")
    (got,) = onnxep.InferenceSession(model, providers=["cpu"]).run(None, feeds)
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    (want,) = sess.run(None, feeds)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


def test_the_table_runs_without_onnxruntime_gpu(tmp_path, capsys, monkeypatch):
    out = tmp_path / "v.json"
    args = ["--models", "resnet-small", "--batches", "1", "--dtypes", "fp32", "--runs", "2"]
    assert V.main([*args, "--providers", "cpu", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| resnet-small | 1 | fp32 |" in text
    rows = json.loads(out.read_text())
    assert rows[0]["max_abs_vs_cpu"] == 0.0
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert "onnxep timed alone" in rows[0]["onnxruntime"]
