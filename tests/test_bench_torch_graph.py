"""The torch-graph peer's CPU-checkable parts, and the decode summary's bandwidth floor.

The static-cache step (what the CUDA graph captures) runs here eagerly on the
CPU and must give the concatenating peer's logits and tokens; the graph itself
needs CUDA and is exercised by tests/cuda/test_cuda_torch_graph.py.
"""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import onnxep
from onnxep.errors import NotSupported
from onnxep.generation.spec import DecodeState, decode_spec, model_dims
from onnxep.tools.benchmark import bench
from onnxep.tools.benchmark.decode_report import floor_line, floor_ms, report, weight_bytes

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench/ is imported from the repo root, not installed
from bench.factory import build_genai_decoder, build_hybrid_decoder  # noqa: E402

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module", params=["genai", "hybrid"])
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param) / "model.onnx"
    build = build_genai_decoder if request.param == "genai" else build_hybrid_decoder
    build("tiny", seed=4, out_path=path)
    return str(path)


def _concat_decode(model: str, prompt: np.ndarray, steps: int):
    """The concatenating peer through host feeds: tokens and each run's last logits."""
    from onnxep.tools.benchmark.loops import to_numpy
    from onnxep.tools.benchmark.torch_peer import load_torch_peer

    peer = load_torch_peer(model)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    spec = decode_spec(sess.get_inputs(), sess.get_outputs())
    names = [o.name for o in sess.get_outputs()]
    batch = prompt.shape[0]
    state = DecodeState(spec, prompt.shape[1], batch, prompt=prompt, dims=model_dims(model))
    tokens, logits = [], []
    for _ in range(steps):
        with torch.inference_mode():
            out = dict(zip(names, to_numpy(peer.run(state.feeds()))))
        last = out[spec.logits][:, -1]
        logits.append(last)
        # DecodeState.advance feeds row 0's token to every row; each row keeps its own here
        tokens.append(np.argmax(last, axis=-1).tolist())
        state.past += state.ids.shape[1]
        state.ids = np.array(tokens[-1], np.int64)[:, None]
        state.states = {s.name: out[s.output] for s in spec.states}
    return tokens, logits


def test_static_cache_steps_equal_the_concatenating_peer(tiny):
    from onnxep.tools.benchmark.torch_peer import load_torch_peer
    from onnxep.tools.benchmark.torch_static import StaticDecoder

    prompt = np.random.default_rng(1).integers(0, 512, (2, 7))
    steps = 6
    want_tokens, want_logits = _concat_decode(tiny, prompt, steps)
    dec = StaticDecoder(load_torch_peer(tiny), prompt, steps, graph=False)
    assert dec.capacity == 7 + steps - 1
    tokens = []
    for k in range(steps):
        tokens.append(dec.step())
        got = dec.last_logits[:, -1].float().numpy()
        np.testing.assert_allclose(got, want_logits[k], rtol=1e-4, atol=1e-5, err_msg=f"step {k}")
    assert tokens == want_tokens and dec.tokens == [t[0] for t in want_tokens]
    assert dec.done and dec.counters()["captures"] == 0 and dec.counters()["policy"] == "off"
    with pytest.raises(onnxep.errors.InvalidArgument, match="all 6 tokens"):
        dec.step()


class _FakeCuda:
    """torch.cuda's capture calls on the CPU: the warm-up runs as on a side stream, the
    "graph" replays by running the decoder's step body, or the capture raises."""

    def __init__(self, decoder, fail: bool) -> None:
        self.decoder, self.fail = decoder, fail

    def Stream(self):  # noqa: N802 - torch's name
        return SimpleNamespace(wait_stream=lambda other: None)

    current_stream = Stream

    def stream(self, s):
        return nullcontext()

    def CUDAGraph(self):  # noqa: N802 - torch's name
        return SimpleNamespace(replay=self.decoder.decode_body)

    def graph(self, g):
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        return nullcontext()


@pytest.mark.parametrize("fail", [False, True], ids=["replayed", "capture-fails"])
def test_capture_bookkeeping_and_fallback_keep_the_eager_tokens(tiny, fail):
    """Warm-up steps advance the hybrid's conv and recurrent states; the capture undoes
    them, so replays (or the eager steps after a failed capture) give the eager tokens."""
    from onnxep.tools.benchmark.torch_peer import load_torch_peer
    from onnxep.tools.benchmark.torch_static import StaticDecoder

    peer = load_torch_peer(tiny)
    prompt = np.random.default_rng(2).integers(0, 512, (1, 5))
    eager = StaticDecoder(peer, prompt, 7)
    while not eager.done:
        eager.step()
    dec = StaticDecoder(peer, prompt, 7)
    dec.graph_wanted = True  # as graph=True does where CUDA is
    dec.torch = SimpleNamespace(**{n: getattr(torch, n) for n in ("no_grad", "arange", "argmax")})
    dec.torch.cuda = _FakeCuda(dec, fail)
    while not dec.done:
        dec.step()
    assert dec.tokens == eager.tokens
    c = dec.counters()
    if fail:
        assert (c["policy"], c["captures"], c["replays"], c["fallbacks"]) == ("off", 0, 0, 1)
        assert "operation not permitted when stream is capturing" in c["failures"][0]
    else:
        assert (c["policy"], c["captures"], c["replays"], c["fallbacks"]) == ("whole", 1, 6, 0)


def test_static_decoder_refuses_a_graph_without_cuda(tiny):
    from onnxep.tools.benchmark.torch_peer import load_torch_peer
    from onnxep.tools.benchmark.torch_static import StaticDecoder

    with pytest.raises(NotSupported, match="CUDA"):
        StaticDecoder(load_torch_peer(tiny), np.zeros((1, 3), np.int64), 2, graph=True)


def test_torch_graph_is_a_peer_the_cli_accepts():
    from onnxep.tools import cli_args

    assert cli_args.peers("torch,torch-graph") == ["torch", "torch-graph"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the reason given without CUDA")
def test_torch_graph_without_cuda_says_why(tiny):
    from onnxep.tools.benchmark.sides import make_peer

    with pytest.raises(NotSupported, match=r"torch-graph needs CUDA graphs: torch .*"):
        make_peer("torch-graph", tiny, want_cuda=True)


def test_torch_graph_is_skipped_with_its_reason_when_onnxep_runs_on_the_cpu(tiny):
    res = bench(tiny, ["cpu"], vs=["torch-graph"], decode=2, context=4, warmup=1, progress=False)
    assert "needs a CUDA provider" in res.skipped["torch-graph"]
    assert "onnxep" in res.summary
    assert "torch-graph" in res.table() and "skipped" in res.table()


# -- the summary's bandwidth floor ------------------------------------------------------------


def test_weight_bytes_are_the_initializers_as_stored(tmp_path):
    path = tmp_path / "int4" / "model.onnx"
    build_genai_decoder("tiny", seed=0, dtype="int4", out_path=path)
    proto = onnx.load(str(path))
    want = sum(numpy_helper.to_array(t).nbytes for t in proto.graph.initializer)
    assert weight_bytes(str(path)) == want


def test_floor_fraction_is_the_floor_over_each_sides_step():
    assert floor_ms(4_260_000_000) == pytest.approx(1.0)
    result = {
        "weight_bytes": 2_130_000_000,  # 0.5 ms at 4.26 TB/s
        "summary": {"onnxep-graph": {"median_ms": 1.0}, "torch-graph": {"median_ms": 2.0}},
    }
    line = floor_line(result)
    assert "= 0.500 ms/step" in line
    assert "onnxep-graph 50.0%" in line and "torch-graph 25.0%" in line
    with pytest.raises(ValueError, match="bandwidth must be positive"):
        floor_ms(1, 0)


def test_report_prints_each_run_with_captures_and_floor(tmp_path):
    r = {
        "model": "/nowhere/model.onnx",
        "weight_bytes": 4_260_000_000,
        "summary": {"onnxep": {"median_ms": 4.0}, "torch-graph": {"median_ms": 2.0}},
        "sides": [
            {"name": "onnxep", "state_path": "shared-buffer"},
            {
                "name": "torch-graph",
                "capacity": 80,
                "capture_timed": {
                    "policy": "whole",
                    "captures": 1,
                    "replays": 63,
                    "fallbacks": 0,
                    "failures": [],
                },
            },
        ],
        "tokens": {"onnxep": [1, 2, 3], "torch-graph": [1, 2, 4]},
        "skipped": {"torch": "NotSupported: no"},
    }
    (tmp_path / "decode-1.5b_fp16_ctx16.json").write_text(json.dumps(r))
    (tmp_path / "decode_fp16_ctx16.json").write_text(json.dumps({**r, "weight_bytes": None}))
    text = report(str(tmp_path), "decode-1.5b_*_ctx*.json")
    assert text.startswith("fp16 context 16: onnxep 250.0 tok/s 4.000 ms/step")
    assert "torch-graph capture whole: timed decode captures 1, replays 63, fallbacks 0" in text
    assert "static cache of 80 rows" in text
    assert "tokens equal: torch-graph 2/3" in text
    assert "1.000 ms/step; fraction of it: onnxep 25.0%, torch-graph 50.0%" in text
    assert "torch skipped: NotSupported: no" in text
    other = report(str(tmp_path), "decode_*_ctx*.json")
    assert "bandwidth floor: n/a" in other and "1.5b" not in other
