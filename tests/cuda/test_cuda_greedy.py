"""Greedy decoding's device side on the GPU: the one-launch argmax and the pipelined loop.

``CUDAProvider.argmax_rows_into`` (ops/argmax_cuda) must give CuPy's argmax (ties to the
lowest index, NaN first) written into the caller's buffer, at a 151936-token vocabulary
too, inside a CUDA graph; ``to_host_async`` must deliver the value queued, not a later
one. ``generate`` queues step t+1 before it reads token t: the tokens are the CPU
provider's, eager and captured, one device-to-host read a step, and the ids of step t+1
come from the device (no host copy of them).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import onnxep

cupy = pytest.importorskip("cupy", reason="the CUDA tests need CuPy and a GPU")

ROOT = Path(__file__).resolve().parents[2]
STEPS = 32
PROMPT = np.random.default_rng(3).integers(0, 512, 8)


@pytest.fixture(scope="module")
def provider():
    sess = onnxep.InferenceSession(
        str(ROOT / "tests" / "data" / "llama_kv.onnx"), providers=["cuda", "cpu"]
    )
    return sess.providers[0]


@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=["f16", "f32"])
@pytest.mark.parametrize(("rows", "n"), [(1, 151936), (1, 512), (4, 32000), (3, 7)])
def test_argmax_rows_into_is_cupys_argmax(provider, rows, n, dtype):
    rng = np.random.default_rng(rows + n)
    x = cupy.asarray(rng.standard_normal((rows, n)).astype(dtype))
    out = cupy.full((rows, 1), -1, cupy.int64)
    provider.argmax_rows_into(x, out)
    assert cupy.array_equal(out[:, 0], cupy.argmax(x, axis=-1))
    provider.argmax_rows_into(x, out)  # the tickets were put back: a second launch agrees
    assert cupy.array_equal(out[:, 0], cupy.argmax(x, axis=-1))


def test_ties_nan_and_a_strided_last_position(provider):
    n = 151936
    x = cupy.zeros((3, 2, n), cupy.float16)
    x[0, -1, cupy.asarray([9, 100000, n - 1])] = 4.0
    x[1, -1, cupy.asarray([500, 140000])] = cupy.nan
    x[2, -1, :] = -cupy.inf
    out = cupy.zeros((3, 1), cupy.int64)
    provider.argmax_rows_into(x[:, -1], out)  # rows strided by the sequence axis
    assert out[:, 0].tolist() == [9, 500, 0]


def test_argmax_inside_a_cuda_graph(provider):
    rng = np.random.default_rng(5)
    x = cupy.asarray(rng.standard_normal((1, 151936)).astype(np.float16))
    out = cupy.zeros((1, 1), cupy.int64)
    provider.argmax_rows_into(x, out)  # built and its scratch made before the capture
    stream = provider.stream
    with stream:
        stream.begin_capture()
        provider.argmax_rows_into(x, out)
        graph = stream.end_capture()
        for k in range(3):
            x[0, 1000 * (k + 1)] = 50.0 + k
            out.fill(-1)
            graph.launch(stream)
            stream.synchronize()
            assert int(out[0, 0]) == 1000 * (k + 1)


def test_to_host_async_delivers_the_value_it_queued(provider):
    with provider.run_context():
        x = cupy.arange(4, dtype=cupy.int64)
        wait = provider.to_host_async(x)
        x += 100  # queued after the copy: not what the copy reads
        got = wait()
    assert got.tolist() == [0, 1, 2, 3]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, str]:
    sys.path.insert(0, str(ROOT))  # bench/ is imported from the repo root, not installed
    from bench.factory import build_genai_decoder

    out = tmp_path_factory.mktemp("greedy")
    paths = {}
    for dtype in ("fp16", "int4"):
        path = out / dtype / "model.onnx"
        build_genai_decoder("tiny", seed=4, dtype=dtype, out_path=path)
        paths[dtype] = str(path)
    return paths


@pytest.mark.parametrize("capture", ["off", "auto"])
@pytest.mark.parametrize("dtype", ["fp16", "int4"])
def test_pipelined_decode_gives_the_cpu_tokens(tiny, dtype, capture, monkeypatch):
    cpu = onnxep.InferenceSession(tiny[dtype], providers=["cpu"])
    want = onnxep.generate(cpu, PROMPT, STEPS, progress=False).tokens
    sess = onnxep.InferenceSession(tiny[dtype], providers=[("cuda", {"capture": capture}), "cpu"])
    p = sess.providers[0]
    reads = []
    real = type(p).to_host

    def to_host(self, value):
        reads.append(getattr(value, "shape", None))
        return real(self, value)

    monkeypatch.setattr(type(p), "to_host", to_host)  # a synchronous read would show here
    res = onnxep.generate(sess, PROMPT, STEPS, progress=False)
    assert res.tokens == want
    assert res.device_to_host_reads == [1] * STEPS  # the token ids, queued, read once a step
    assert not reads, reads  # no step waited on a synchronous read
    if capture == "auto":
        assert res.capture_stats["replays"] > 0, res.capture_stats
