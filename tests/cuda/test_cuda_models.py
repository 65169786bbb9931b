"""The torch-exported decoders and the CNN in tests/data, every compute node on CUDA."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import EXPORTED_DIMS, exported_feeds

import onnxep

DATA = Path(__file__).resolve().parent.parent / "data"
CASES = EXPORTED_DIMS


@pytest.mark.parametrize("name", sorted(CASES))
def test_runs_on_cuda_like_the_cpu(name):
    path = str(DATA / name)
    cpu = onnxep.InferenceSession(path, providers=["cpu"])
    gpu = onnxep.InferenceSession(path, providers=["cuda", "cpu"])
    off = [n for n in gpu.placement() if n.role == "compute" and n.provider != "cuda"]
    assert not off, "; ".join(f"{n.node} ({n.op_type}): {n.declined}" for n in off)
    feeds = exported_feeds(cpu, CASES[name], np.random.default_rng(0))
    want = cpu.run(None, feeds)
    gpu.run(None, feeds)
    cuda = gpu.providers[0]
    before = cuda.transfer_counts()["device_to_host"]
    got = gpu.run(None, feeds)
    reads = cuda.transfer_counts()["device_to_host"] - before
    assert reads == len(got), f"{reads} device-to-host reads for {len(got)} outputs"
    for arg, g, w in zip(gpu.get_outputs(), got, want):
        g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
        err = np.abs(g64 - w64) - (1e-4 + 1e-3 * np.abs(w64))
        assert g.shape == w.shape and np.all(err <= 0), f"{arg.name}: max excess {err.max():.3g}"
