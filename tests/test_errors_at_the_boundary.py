"""Internal errors that leaked to users, each now one sentence at the boundary (issue 21.5):
the command line's exit code and first line of stderr, and the session's feeds."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper

import onnxep
from onnxep.errors import RunError


def _cli(*args, **kw):
    return subprocess.run(
        [sys.executable, "-m", "onnxep.cli", *args], capture_output=True, text=True, **kw
    )


def test_a_json_file_given_as_the_model_is_one_sentence(tmp_path):
    cfg = tmp_path / "genai_config.json"
    cfg.write_text(json.dumps({"model": {"decoder": {"filename": "model.onnx"}}}))
    proc = _cli("run", str(cfg))
    assert proc.returncode == 2
    first = proc.stderr.splitlines()[0]
    assert first.startswith("onnxep: error:") and "is a JSON file, not an ONNX model" in first
    assert "Traceback" not in proc.stderr


def test_an_unknown_flag_shows_the_subcommand_usage():
    proc = _cli("run", "--bogus")
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert lines[0] == "onnxep: error: unrecognized arguments: --bogus"
    assert lines[1].startswith("usage: onnxep run ")


def test_explain_into_a_closed_pipe_leaves_no_traceback(tmp_path):
    path = tmp_path / "wide.onnx"
    nodes = [
        helper.make_node("Relu", ["x" if i == 0 else f"t{i - 1}"], [f"t{i}"]) for i in range(3000)
    ]
    nodes.append(helper.make_node("Identity", ["t2999"], ["y"]))
    onnx.save(make_model(nodes, [tensor("x", [2])], [tensor("y", [2])]), str(path))
    proc = subprocess.Popen(
        [sys.executable, "-m", "onnxep.cli", "explain", str(path), "--max-nodes", "3000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.readline()
    proc.stdout.close()  # what `| head -1` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) in (0, 141)
    assert "Traceback" not in err and "BrokenPipeError" not in err


def _conv_model():
    w = helper.make_tensor("w", TensorProto.FLOAT, [1, 1, 3, 3], np.ones(9, np.float32))
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_torch_tensor_is_a_feed_like_a_numpy_array():
    torch = pytest.importorskip("torch")
    sess = onnxep.InferenceSession(_conv_model(), providers=["cpu"])
    x = torch.arange(16, dtype=torch.float32).reshape(1, 1, 4, 4)
    (got,) = sess.run(None, {"x": x})
    np.testing.assert_array_equal(got, sess.run(None, {"x": x.numpy()})[0])


def test_a_conv_input_shorter_than_its_kernel_names_the_axis():
    sess = onnxep.InferenceSession(_conv_model(), providers=["cpu"])
    with pytest.raises(RunError, match="spatial axis 2 has 2 elements.*kernel's extent 3"):
        sess.run(None, {"x": np.ones((1, 1, 2, 2), np.float32)})
    (ok,) = sess.run(None, {"x": np.ones((1, 1, 3, 3), np.float32)})  # the session stays usable
    assert ok.shape == (1, 1, 1, 1)


def test_pad_reflect_wider_than_the_axis_is_refused_as_onnxruntime_refuses_it():
    pads = helper.make_tensor("p", TensorProto.INT64, [8], [0, 0, 2, 2, 0, 0, 2, 2])
    g = helper.make_graph(
        [helper.make_node("Pad", ["x", "p"], ["y"], mode="reflect")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [pads],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = onnxep.InferenceSession(m, providers=["cpu"])
    for side in (1, 2):
        with pytest.raises(RunError, match="Pad reflect: axis 2 has .* needs at least 2"):
            sess.run(None, {"x": np.ones((1, 1, side, side), np.float32)})
    (ok,) = sess.run(None, {"x": np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)})
    ort = pytest.importorskip("onnxruntime")
    x = np.arange(9, dtype=np.float32).reshape(1, 1, 3, 3)
    np.testing.assert_array_equal(
        ok, ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]
    )
