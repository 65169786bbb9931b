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
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "onnxep.tools.cli"]
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
    from onnxep import get_available_providers

    res = onnxep("run", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "default.onnx" in res.stdout
    assert "output probs: float32 [1, 10]" in res.stdout
    # the default providers: whichever are installed and available, so no fixed order
    (line,) = [x for x in res.stdout.splitlines() if x.startswith("nodes per provider: ")]
    used = {item.split("=")[0] for item in line.removeprefix("nodes per provider: ").split(", ")}
    assert used and used <= set(get_available_providers()), line


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
    # Bernoulli's draws are random: a case passes when it happens to draw the recorded values
    # (seen once in a full run), so two of them, each listed with its reason when it fails.
    res = onnxep(
        "conformance", "--category", "node", "--pattern", "^test_(abs|relu|bernoulli(_double)?)$"
    )
    assert res.returncode == 0, res.stdout + res.stderr
    fails = res.stdout.count("excluded: the output is random")
    assert 1 <= fails <= 2, res.stdout
    assert f"node                   {4 - fails} passed     {fails} failed of 4" in res.stdout
    assert "FAIL [node] test_bernoulli" in res.stdout


# --- user errors, through onnxep.tools.cli.main: exit 2, one "onnxep: error:" line, no trace ---


@pytest.fixture
def small_model(tmp_path, add_relu_model):
    """x[N, 4], y[N, 4] -> Add -> Relu -> Softmax, saved to a file."""
    import onnx

    path = tmp_path / "small.onnx"
    onnx.save(add_relu_model, str(path))
    return str(path)


def user_error(capsys, argv):
    from onnxep.tools.cli import main

    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("onnxep: error: "), err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize(
    ("dim", "why"),
    [
        ("N", "'N' is not NAME=INT"),
        ("N=abc", "'abc' is not an integer"),
        ("=", "'=' is not NAME=INT"),
        ("=3", "'=3' is not NAME=INT"),
        ("N=", "'N=' is not NAME=INT"),
        ("N=-1", "a dim must be from 0 to 2147483647, got -1"),
        ("N=100000000000", "a dim must be from 0 to 2147483647"),
        ("N=200000000", "the limit is 1,073,741,824"),
        ("batch=2", "--dim batch: no input of the model has a dim of that name"),
    ],
)
@pytest.mark.parametrize("cmd", ["run", "parity"])
def test_bad_dim(capsys, small_model, cmd, dim, why):
    extra = ["--providers", "cpu"] if cmd == "parity" else []
    err = user_error(capsys, [cmd, small_model, *extra, "--dim", dim])
    assert why in err


def test_dim_naming_no_input_lists_the_real_ones(capsys, small_model):
    err = user_error(capsys, ["run", small_model, "--dim", "batch=2"])
    assert "its inputs' symbolic dims are N" in err


def test_dim_given_twice(capsys, small_model):
    err = user_error(capsys, ["run", small_model, "--dim", "N=2", "--dim", "N=3"])
    assert "--dim N is given twice (2 and 3)" in err


def test_good_dims_still_run(capsys, small_model):
    from onnxep.tools.cli import main

    assert main(["run", small_model, "--dim", "N=3", "--dim", "N=3"]) == 0
    assert "input  x: float32 [3, 4]" in capsys.readouterr().out


def test_bench_dims_are_checked_before_timing(capsys, small_model):
    err = user_error(capsys, ["bench", small_model, "--vs", "", "--dim", "M=2"])
    assert "no input of the model has a dim of that name" in err


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--pattern", "("], "'(' is not a valid regular expression"),
        (["--category", "bogus"], "unknown category 'bogus'; choose from node, simple"),
        (["--category", ","], "unknown category ','"),
        (["--providers", "nope", "--pattern", "^test_abs$"], "unknown provider 'nope'"),
        (["--category", "simple", "--pattern", "^no_such_case$"], "no case in simple matches"),
    ],
)
def test_conformance_bad_arguments(capsys, argv, why):
    assert why in user_error(capsys, ["conformance", *argv])


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["--vs", "bogus"], "unknown peer 'bogus'; choose from onnxruntime, reference, torch"),
        (["--vs", "reference,ort"], "unknown peer 'ort'"),
        (["--runs", "0"], "argument --runs: 0 is out of range"),
        (["--runs", "-3"], "argument --runs: -3 is out of range"),
        (["--warmup", "-1"], "argument --warmup: -1 is negative"),
        (["--decode", "0"], "argument --decode: 0 is out of range"),
        (["--decode", "x"], "argument --decode: 'x' is not an integer"),
        (["--context", "0"], "argument --context: 0 is out of range"),
        (["--context", "-5"], "argument --context: -5 is out of range"),
        (["--json", "/no/such/folder/r.json"], "folder '/no/such/folder' does not exist"),
        (["--plot", "/no/such/folder/r.png"], "folder '/no/such/folder' does not exist"),
        (["--providers", "nope", "--vs", ""], "unknown provider 'nope'"),
    ],
)
def test_bench_bad_arguments(capsys, small_model, argv, why):
    assert why in user_error(capsys, ["bench", small_model, *argv])


def test_bench_plot_suffix_matplotlib_cannot_write(capsys, small_model, tmp_path):
    pytest.importorskip("matplotlib")
    err = user_error(capsys, ["bench", small_model, "--plot", str(tmp_path / "r.foo")])
    assert "matplotlib cannot save foo; use one of" in err


def test_bench_json_into_a_folder(capsys, small_model, tmp_path):
    err = user_error(capsys, ["bench", small_model, "--json", str(tmp_path)])
    assert "is a folder; give a file name to write" in err


def test_bench_decode_on_a_model_that_is_not_a_decoder(capsys, small_model):
    err = user_error(capsys, ["bench", small_model, "--decode", "2", "--vs", "", "--warmup", "1"])
    assert "decode mode does not know how to feed input 'y'" in err


def test_bench_where_onnxep_cannot_run_the_model(capsys):
    # One float input and no KV cache: decode mode has nothing to drive.
    err = user_error(
        capsys,
        ["bench", str(DATA / "resnet_cnn.onnx"), "--decode", "1", "--vs", "", "--warmup", "1"],
    )
    assert "onnxep could not run the model: InvalidArgument: greedy decoding needs" in err
    assert "inputs are ['image']" in err


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["run", "--seed", "-1"], "argument --seed: -1 is negative"),
        (["run", "--max-nodes", "-1"], "argument --max-nodes: -1 is negative"),
        (["run", "--providers", ","], "argument --providers: ',' names nothing"),
        (["run", "--providers", "nope"], "unknown provider 'nope'"),
        (["explain", "MODEL", "--providers", "nope"], "unknown provider 'nope'"),
        (["explain", "MODEL", "--max-nodes", "-2"], "argument --max-nodes: -2 is negative"),
        (["parity", "MODEL", "--providers", "nope"], "unknown provider 'nope'"),
        (["parity", "MODEL", "--providers", "cpu", "--reference", "nope"], "'nope'"),
        (["parity", "MODEL", "--providers", "cpu", "--rtol", "-1"], "--rtol: -1 is not"),
        (["parity", "MODEL", "--providers", "cpu", "--atol", "nan"], "--atol: nan is not"),
        (["parity", "MODEL", "--providers", "cpu", "--rtol", "x"], "'x' is not a number"),
        (["parity", "MODEL"], "the following arguments are required: --providers"),
        ([], "the following arguments are required: cmd"),
        (["nosuchcmd"], "invalid choice: 'nosuchcmd'"),
        (["run", "MODEL", "b.onnx"], "unrecognized arguments: b.onnx"),
    ],
)
def test_other_bad_arguments(capsys, small_model, argv, why):
    argv = [small_model if a == "MODEL" else a for a in argv]
    assert why in user_error(capsys, argv)


@pytest.mark.parametrize("cmd", ["run", "explain", "bench", "parity"])
def test_bad_model_paths(capsys, tmp_path, cmd):
    extra = ["--providers", "cpu"] if cmd == "parity" else []
    missing = str(tmp_path / "missing.onnx")
    assert "does not exist" in user_error(capsys, [cmd, missing, *extra])
    assert "is a folder" in user_error(capsys, [cmd, str(tmp_path), *extra])
    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)  # reading a pipe or a device as a model could block forever
    assert "is not a regular file" in user_error(capsys, [cmd, str(fifo), *extra])
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x0a\xff\xff\xff" * 16)
    assert "is not an ONNX model" in user_error(capsys, [cmd, str(garbage), *extra])


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_model(capsys, small_model):
    os.chmod(small_model, 0)
    assert "cannot be read: Permission denied" in user_error(capsys, ["run", small_model])


def test_broken_plugins_file(capsys, monkeypatch, tmp_path):
    bad = tmp_path / "plugins.toml"
    bad.write_text("order = [")
    monkeypatch.setenv("ONNXEP_PLUGINS", str(bad))
    assert "is not valid TOML" in user_error(capsys, ["providers"])


def _model_with_short_initializer(tmp_path):
    import numpy as np
    from conftest import make_model, tensor
    from onnx import helper, numpy_helper

    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    w.raw_data = w.raw_data[:10]  # 10 bytes for 16 floats
    m = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"])], [tensor("x", [4, 4])], [tensor("y", [4, 4])]
    )
    m.graph.initializer.append(w)
    path = tmp_path / "short.onnx"
    path.write_bytes(m.SerializeToString())
    return path


def _model_with_truncated_external_data(tmp_path):
    import numpy as np
    import onnx
    from conftest import make_model, tensor
    from onnx import helper, numpy_helper

    w = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    m = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        [tensor("x", [64, 64])],
        [tensor("y", [64, 64])],
        [w],
    )
    path = tmp_path / "ext.onnx"
    onnx.save(m, str(path), save_as_external_data=True, location="ext.bin", size_threshold=0)
    data = tmp_path / "ext.bin"
    data.write_bytes(data.read_bytes()[:100])
    return path


@pytest.mark.parametrize(
    "make", [_model_with_short_initializer, _model_with_truncated_external_data]
)
@pytest.mark.parametrize("cmd", ["run", "explain"])
def test_model_with_corrupt_data(capsys, tmp_path, make, cmd):
    err = user_error(capsys, [cmd, str(make(tmp_path))])
    assert "'w'" in err
