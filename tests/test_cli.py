"""The onnxep command line, run as the installed console script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


def onnxep(*args, env=None, cwd=None):
    exe = Path(sys.executable).parent / "onnxep"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "onnxep.cli"]
    return subprocess.run(
        [*cmd, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300
    )


def test_providers_lists_builtin_and_failures(toy_dist):
    env = {**os.environ, "PYTHONPATH": str(toy_dist)}
    res = onnxep("providers", env=env)
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "cpu" in out and "available" in out
    assert "toy" in out
    assert "plugins that failed" in out and "broken" in out and "libfoo" in out


def test_run_without_model_uses_bundled_one(tmp_path):
    res = onnxep("run", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "default.onnx" in res.stdout
    assert "output probs: float32 [1, 10]" in res.stdout
    assert "nodes per provider: cpu=" in res.stdout


def test_run_a_model_with_dims():
    res = onnxep("run", str(DATA / "resnet_cnn.onnx"), "--providers", "cpu", "--dim", "batch=2")
    assert res.returncode == 0, res.stderr
    assert "output logits: float32 [2, 10]" in res.stdout


def test_explain_shows_counts_and_fallback_reasons(toy_dist, tmp_path):
    import onnx
    from conftest import make_model, tensor
    from onnx import helper

    m = make_model(
        [
            helper.make_node("Add", ["x", "x"], ["s"], name="add"),
            helper.make_node("Softmax", ["s"], ["y"], name="softmax"),
        ],
        [tensor("x", [2, 3])],
        [tensor("y", [2, 3])],
    )
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    env = {**os.environ, "PYTHONPATH": str(toy_dist)}
    res = onnxep("explain", str(path), "--providers", "toy,cpu", env=env)
    assert res.returncode == 0, res.stderr
    assert "nodes per provider: cpu=1, toy=1" in res.stdout
    assert "toy declined: Softmax: no kernel" in res.stdout
    assert "copy 's' toy -> cpu" in res.stdout


def test_bad_provider_is_one_line_error():
    res = onnxep("run", "--providers", "nope")
    assert res.returncode == 2
    assert res.stderr.startswith("onnxep: error: unknown provider 'nope'")
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("cmd", [["--help"], ["run", "--help"]])
def test_help(cmd):
    assert onnxep(*cmd).returncode == 0


def test_conformance_prints_counts_and_reasons():
    res = onnxep("conformance", "--category", "node", "--pattern", "^test_(abs|relu|bernoulli)$")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "node" in res.stdout and "2 passed" in res.stdout
    assert "FAIL [node] test_bernoulli: excluded: the output is random" in res.stdout
