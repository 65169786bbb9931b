"""Real exported models (tests/data, made by make_models.py) match onnxruntime's CPU run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import EXPORTED_DIMS, exported_feeds

import onnxep

ort = pytest.importorskip("onnxruntime")
DATA = Path(__file__).parent / "data"


def assert_close(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    err = np.abs(got.astype(np.float64) - want)
    bound = 1e-4 + 1e-3 * np.abs(want.astype(np.float64))
    worst = np.unravel_index(np.argmax(err - bound), err.shape) if err.size else ()
    assert np.all(err <= bound), (
        f"{what}: worst at {worst}: onnxep {got[worst]} vs onnxruntime {want[worst]}"
    )


def compare(name, dims, seed=0):
    path = str(DATA / name)
    ours = onnxep.InferenceSession(path, providers=["cpu"])
    theirs = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = exported_feeds(ours, dims, np.random.default_rng(seed))
    got = ours.run(None, feeds)
    want = theirs.run(None, feeds)
    for arg, g, w in zip(ours.get_outputs(), got, want):
        assert_close(g, w, f"{name}:{arg.name}")
    return ours, theirs, feeds


CASES = EXPORTED_DIMS


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_onnxruntime(name):
    compare(name, CASES[name])


def test_opset23_export_uses_the_fused_ops():
    import onnx

    ops = {n.op_type for n in onnx.load(str(DATA / "llama_kv_opset23.onnx")).graph.node}
    assert {"RMSNormalization", "Attention"} <= ops


@pytest.mark.parametrize("name", ["llama_kv.onnx", "llama_kv_opset23.onnx"])
def test_greedy_decode_with_cache_matches(name):
    """Prefill then three decode steps, feeding each run's presents back as pasts."""
    ours, theirs, feeds = compare(name, {"batch": 1, "seq": 5, "past": 0})
    outs = {}
    for sess, label in ((ours, "onnxep"), (theirs, "onnxruntime")):
        f = dict(feeds)
        tokens = []
        for _ in range(4):
            res = sess.run(None, f)
            nxt = int(np.argmax(res[0][0, -1]))
            tokens.append(nxt)
            f = {"input_ids": np.array([[nxt]], np.int64)}
            names = [a.name for a in sess.get_inputs()][1:]
            f.update(dict(zip(names, res[1:])))
        outs[label] = tokens
    assert outs["onnxep"] == outs["onnxruntime"]
