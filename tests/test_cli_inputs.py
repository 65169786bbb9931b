"""The command line fed real inputs (--inputs), whole shapes (--shape), integer ranges
(--int-range), and model folders read through their genai_config.json (issue 21.4)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
GENAI = ROOT / "tests" / "data" / "genai" / "qwen2_fp32"


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "onnxep.cli", *args], capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def model(tmp_path):
    """y = x * 2 over an input with no dim names, and an integer input passed through."""
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    m = make_model(
        [helper.make_node("Mul", ["x", "two"], ["y"]), helper.make_node("Identity", ["sr"], ["r"])],
        [tensor("x", [None, None]), tensor("sr", [1], TensorProto.INT64)],
        [tensor("y", [None, None]), tensor("r", [1], TensorProto.INT64)],
        inits=[two],
    )
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    return path


def _outputs(proc):
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["outputs"]


def test_inputs_from_npz_npy_and_pb(model, tmp_path):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.savez(tmp_path / "f.npz", x=x, sr=np.array([16000], np.int64))
    out = _outputs(_cli("run", str(model), "--inputs", str(tmp_path / "f.npz"), "--json"))
    assert out["y"]["values"] == (x * 2).tolist() and out["r"]["values"] == [16000]
    np.save(tmp_path / "x.npy", x)
    out = _outputs(_cli("run", str(model), "--inputs", f"x={tmp_path / 'x.npy'}", "--json"))
    assert out["y"]["values"] == (x * 2).tolist()
    data = tmp_path / "test_data_set_0"
    data.mkdir()
    (data / "input_0.pb").write_bytes(numpy_helper.from_array(x).SerializeToString())
    (data / "input_1.pb").write_bytes(
        numpy_helper.from_array(np.array([8000], np.int64)).SerializeToString()
    )
    out = _outputs(_cli("run", str(model), "--inputs", str(data), "--json"))
    assert out["y"]["values"] == (x * 2).tolist() and out["r"]["values"] == [8000]


def test_shape_sets_dims_that_have_no_names(model):
    out = _outputs(_cli("run", str(model), "--shape", "x=3,5", "--json"))
    assert out["y"]["shape"] == [3, 5]


def test_int_range_keeps_random_integers_in_range(model):
    out = _outputs(_cli("run", str(model), "--int-range", "sr=8000,8001", "--json"))
    assert out["r"]["values"] == [8000]


@pytest.mark.parametrize(
    "args, first",
    [
        (["--inputs", "nope.npz"], "--inputs 'nope.npz' does not exist"),
        (["--shape", "x=abc"], "is not NAME=D0,D1"),
        (["--shape", "q=1,2"], "--shape 'q': the model has no such input"),
        (["--int-range", "sr=5,1"], "is not NAME=LOW,HIGH with LOW < HIGH"),
        (["--shape", "sr=1,2"], "does not fit the declared shape"),
    ],
)
def test_bad_feed_options_are_one_sentence(model, args, first):
    proc = _cli("run", str(model), *args)
    assert proc.returncode == 2
    assert first in proc.stderr.splitlines()[0]


def test_a_genai_folder_is_a_model_with_its_head_size():
    out = _outputs(_cli("run", str(GENAI), "--json"))
    cfg = json.loads((GENAI / "genai_config.json").read_text())["model"]["decoder"]
    assert out["present.0.key"]["shape"][-1] == cfg["head_size"]


def test_parity_and_bench_take_the_same_inputs(model, tmp_path):
    x = np.ones((2, 2), np.float32)
    np.savez(tmp_path / "f.npz", x=x)
    proc = _cli("parity", str(model), "--providers", "cpu", "--inputs", str(tmp_path / "f.npz"))
    assert proc.returncode == 0 and "parity: ok" in proc.stdout, proc.stderr
    proc = _cli(
        "bench",
        str(model),
        "--vs",
        "onnxruntime",
        "--runs",
        "3",
        "--warmup",
        "1",
        "--shape",
        "x=4,4",
    )
    assert proc.returncode == 0, proc.stderr
