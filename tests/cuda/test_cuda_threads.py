"""One CUDA session called from many threads gets the serial results.

Runs on one CUDA provider share its stream and, once captured, a graph's fixed buffers: a
run from another thread while one captures used to invalidate the capture
(cudaErrorStreamCaptureInvalidated), and concurrent completions on one Generator failed
(found by bench/serve.py's in-process peer on the H200).
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import onnxep

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for text_models
from text_models import make_text_folder  # noqa: E402

cupy = pytest.importorskip("cupy")

DATA = Path(__file__).resolve().parents[1] / "data"


def test_eight_threads_through_warm_up_capture_and_replay_match_serial():
    sess = onnxep.InferenceSession(str(DATA / "resnet_cnn.onnx"), providers=["cuda", "cpu"])
    rng = np.random.default_rng(2)
    feeds = [
        {"image": rng.standard_normal((1 + i % 2, 3, 64, 64)).astype(np.float32)} for i in range(16)
    ]
    serial = [sess.run(None, f)[0] for f in feeds]
    # a fresh session: its first concurrent runs warm up and capture while others run
    fresh = onnxep.InferenceSession(str(DATA / "resnet_cnn.onnx"), providers=["cuda", "cpu"])
    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in range(3):
            for s, p in zip(serial, pool.map(lambda f: fresh.run(None, f)[0], feeds)):
                np.testing.assert_allclose(p, s, rtol=1e-5, atol=1e-5)


def test_concurrent_completions_on_one_generator_match_serial(tmp_path):
    gen = onnxep.Generator(make_text_folder(tmp_path / "qwen2"), providers=["cuda", "cpu"])
    prompts = ["Once upon a time", "The quick brown fox", "What is your name?", "Hi"] * 2
    serial = [gen.generate(p, max_new_tokens=12).token_ids for p in prompts]
    with ThreadPoolExecutor(max_workers=8) as pool:
        parallel = list(pool.map(lambda p: gen.generate(p, max_new_tokens=12).token_ids, prompts))
    assert parallel == serial
