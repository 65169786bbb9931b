"""``onnxep serve MODEL`` as the installed console script.

It prints the URL once the deployment answers, serves on loopback, and
Ctrl-C (SIGINT) shuts Ray down and exits 0; a model that cannot load, or a
bad option, is one sentence on stderr and exit 2. The tests that start Ray
are marked ``serve``; the option checks run before Ray and are in the default
run.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from serve_http import call, free_port, infer_npz
from test_cli import onnxep as onnxep_cli

import onnxep

RESNET = Path(__file__).parent / "data" / "resnet_cnn.onnx"


def _command() -> list[str]:
    exe = Path(sys.executable).parent / "onnxep"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "onnxep.cli"]


def _lines(stream, out: queue.Queue) -> None:
    for line in iter(stream.readline, ""):
        out.put(line)
    out.put(None)


@pytest.mark.serve
def test_serve_prints_the_url_serves_and_stops_on_ctrl_c():
    port = free_port()
    proc = subprocess.Popen(
        [*_command(), "serve", str(RESNET), "--port", str(port), "--max-batch", "4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(proc.stdout, lines), daemon=True).start()
    try:
        first = lines.get(timeout=240)
        assert first is not None, proc.stderr.read()
        url = f"http://127.0.0.1:{port}"
        assert first.startswith(f"onnxep: serving {RESNET} at {url} (1 replica(s), batches of up")
        feeds = {"image": np.random.default_rng(0).standard_normal((2, 3, 64, 64), np.float32)}
        status, out = infer_npz(f"{url}/infer", feeds)
        assert status == 200, out
        so = onnxep.SessionOptions()
        so.intra_op_num_threads = 1  # the replica's BLAS threads
        local = onnxep.InferenceSession(str(RESNET), so, providers=["cpu"])
        assert out["logits"].tobytes() == local.run(None, feeds)[0].tobytes()
        assert call(f"{url}/health")[0] == 200
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert rc == 0, proc.stderr.read()
    assert "onnxep: stopping" in proc.stderr.read()
    with pytest.raises(OSError):  # nobody listens there any more
        call(f"http://127.0.0.1:{port}/health")


@pytest.mark.serve
def test_a_model_that_cannot_load_is_one_sentence_and_exit_2(tmp_path):
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"not a model")
    t0 = time.monotonic()
    res = onnxep_cli("serve", str(bad), "--port", str(free_port()))
    assert res.returncode == 2, res.stderr[-2000:]
    line = next(ln for ln in res.stderr.splitlines() if ln.startswith("onnxep: error:"))
    why = f"{str(bad.resolve())!r} is not an ONNX model"
    assert line.startswith(f"onnxep: error: the deployment of {bad} failed: {why}")
    assert "Traceback" not in res.stderr
    # stdout has no URL; Ray's own shutdown note ("(raylet) Task ServeController...") may be there
    assert not any(ln.startswith("onnxep") for ln in res.stdout.splitlines())
    assert time.monotonic() - t0 < 240


@pytest.mark.parametrize(
    "argv, first_line",
    [
        (["--port", "0"], "onnxep: error: argument --port: '0' is not a port number"),
        (["--port", "70000"], "onnxep: error: argument --port: '70000' is not a port number"),
        (["--replicas", "0"], "onnxep: error: argument --replicas: '0' is not a whole number"),
        (["--max-batch", "x"], "onnxep: error: argument --max-batch: 'x' is not a whole number"),
        (["--batch-axis", "-1"], "onnxep: error: argument --batch-axis: '-1' is not auto, none"),
        (["--max-tokens", "0"], "onnxep: error: argument --max-tokens: '0' is not a whole number"),
        (["--request-timeout-s", "nan"], "onnxep: error: argument --request-timeout-s: 'nan'"),
        (
            ["--batch-wait-ms", "-2"],
            "onnxep: error: argument --batch-wait-ms: '-2' is not a number",
        ),
    ],
)
def test_bad_options_are_one_sentence_and_exit_2_before_ray_starts(argv, first_line):
    res = onnxep_cli("serve", str(RESNET), *argv)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.splitlines()[0].startswith(first_line), res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""


def test_a_missing_model_and_the_help():
    res = onnxep_cli("serve", "/nonexistent/model.onnx")
    assert res.returncode == 2
    assert res.stderr.splitlines()[0] == (
        "onnxep: error: argument MODEL: model '/nonexistent/model.onnx' does not exist"
    )
    res = onnxep_cli("serve", "--help")
    assert res.returncode == 0 and "--max-prompt-tokens" in res.stdout and "127.0.0.1" in res.stdout


def test_without_ray_serve_it_says_what_to_install(tmp_path):
    # a Python where importing ray fails: the command says which extra brings it
    shim = tmp_path / "ray"
    shim.mkdir()
    (shim / "__init__.py").write_text("raise ImportError('no ray here', name='ray')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    res = onnxep_cli("serve", str(RESNET), env=env)
    assert res.returncode == 2, res.stderr
    assert res.stderr.splitlines()[0] == (
        "onnxep: error: onnxep serve needs Ray Serve (ray is missing): pip install 'onnxep[serve]'"
    )
