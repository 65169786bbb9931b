"""One session run from many threads gets the same outputs as serial runs."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

import onnxep

DATA = Path(__file__).parent / "data"


def test_eight_threads_match_serial():
    sess = onnxep.InferenceSession(str(DATA / "llama_kv.onnx"), providers=["cpu"])
    rng = np.random.default_rng(1)
    feeds = []
    for i in range(16):
        seq, past = 1 + i % 4, 2 + i % 5
        f = {"input_ids": rng.integers(0, 512, (1, seq)).astype(np.int64)}
        for arg in sess.get_inputs()[1:]:
            f[arg.name] = rng.standard_normal((1, 2, past, 64)).astype(np.float32)
        feeds.append(f)
    serial = [sess.run(None, f) for f in feeds]
    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in range(3):
            parallel = list(pool.map(lambda f: sess.run(None, f), feeds))
            for s, p in zip(serial, parallel):
                for a, b in zip(s, p):
                    np.testing.assert_array_equal(a, b)
