"""onnxruntime's API beyond run: OrtValue, run_with_ort_values, set_providers, free-dim
overrides, optimized_model_filepath, and the command line's --version and run --json."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from conftest import make_model, tensor
from onnx import helper

import onnxep
from onnxep.errors import InvalidArgument


def _model(shape=("n", 3)):
    return make_model(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])],
        [tensor("x", list(shape))],
        [tensor("y", list(shape))],
    )


def test_ortvalue_on_the_host_as_onnxruntime_has_it():
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    v = onnxep.OrtValue.ortvalue_from_numpy(x)
    assert v.shape() == [2, 3] and v.data_type() == "tensor(float)" and v.device_name() == "cpu"
    assert v.is_tensor() and v.has_value()
    np.testing.assert_array_equal(v.numpy(), x)
    z = onnxep.OrtValue.ortvalue_from_shape_and_type([2, 3], np.float32)
    z.update_inplace(x)
    np.testing.assert_array_equal(z.numpy(), x)
    with pytest.raises(InvalidArgument, match="update_inplace: the array is float64"):
        z.update_inplace(x.astype(np.float64))
    onnx_int = onnxep.OrtValue.ortvalue_from_shape_and_type([4], onnx.TensorProto.INT64)
    assert onnx_int.numpy().dtype == np.int64


def test_run_with_ort_values_matches_run():
    sess = onnxep.InferenceSession(_model(), providers=["cpu"])
    x = np.array([[-1.0, 2.0, -3.0]], np.float32)
    (out,) = sess.run_with_ort_values(["y"], {"x": onnxep.OrtValue.ortvalue_from_numpy(x)})
    assert isinstance(out, onnxep.OrtValue)
    np.testing.assert_array_equal(out.numpy(), sess.run(None, {"x": x})[0])


def test_set_providers_compiles_again():
    sess = onnxep.InferenceSession(_model(), providers=["cpu"])
    sess.set_providers(["CPUExecutionProvider"])
    assert sess.get_providers() == ["cpu"]
    x = np.ones((1, 3), np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], -x)


def test_free_dimension_override_by_name_fixes_the_dim():
    opts = onnxep.SessionOptions()
    opts.add_free_dimension_override_by_name("n", 2)
    sess = onnxep.InferenceSession(_model(), opts, providers=["cpu"])
    assert sess.get_inputs()[0].shape == [2, 3]
    np.testing.assert_array_equal(sess.run(None, {"x": np.ones((2, 3), np.float32)})[0], -1)
    with pytest.raises(InvalidArgument):
        sess.run(None, {"x": np.ones((5, 3), np.float32)})
    with pytest.raises(InvalidArgument, match="whole number >= 0"):
        opts.add_free_dimension_override_by_name("n", -1)


def test_optimized_model_filepath_writes_a_model_that_runs(tmp_path):
    path = tmp_path / "optimized.onnx"
    opts = onnxep.SessionOptions(optimized_model_filepath=str(path))
    sess = onnxep.InferenceSession(_model(), opts, providers=["cpu"])
    assert path.is_file()
    written = onnxep.InferenceSession(str(path), providers=["cpu"])
    x = np.array([[-1.0, 0.5, 2.0]], np.float32)
    np.testing.assert_array_equal(written.run(None, {"x": x})[0], sess.run(None, {"x": x})[0])
    bad = onnxep.SessionOptions(optimized_model_filepath=str(tmp_path / "no" / "such" / "m.onnx"))
    with pytest.raises(InvalidArgument, match="could not be written"):
        onnxep.InferenceSession(_model(), bad, providers=["cpu"])


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "onnxep.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_cli_version():
    proc = _cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"onnxep {onnxep.__version__}"


def test_cli_run_json(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_model(), str(path))
    proc = _cli("run", str(path), "--dim", "n=2", "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    y = doc["outputs"]["y"]
    assert y["dtype"] == "float32" and y["shape"] == [2, 3]
    assert doc["inputs"]["x"]["shape"] == [2, 3] and doc["providers"] == ["cpu"]
    assert np.all(np.asarray(y["values"]) <= 0)
