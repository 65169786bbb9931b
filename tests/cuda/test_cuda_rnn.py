"""LSTM / GRU / RNN on the GPU: the recurrence kernel alone, captured, and in a VAD model.

The kernel's arithmetic and barriers are tested on the CPU through the emulator
(tests/test_rnn_cuda_emulated.py, the same cases); here the real launch runs after the
real cuBLAS projection, on CUDA alone (no CPU fallback), recorded in a CUDA graph.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import onnxep
from onnxep.errors import BoundsError

pytest.importorskip("cupy", reason="the CUDA tests need CuPy and a GPU")

import rnn_cases as cases  # noqa: E402 - tests/cuda is on the path of its own tests

NODE_SUITE = cases.node_suite_cases()
OWN = {c.id: c for c in cases.OWN}


def _cuda_only(model, capture="whole"):
    opts = onnxep.SessionOptions(disable_fallback=True)
    return onnxep.InferenceSession(
        model.SerializeToString(), opts, [("cuda", {"capture": capture})]
    )


@pytest.mark.parametrize("name", sorted(NODE_SUITE))
def test_node_suite_cases_on_cuda_alone_in_one_graph(name):
    from onnxep.testing import compare_output
    from onnxep.tools.conformance import case_data, case_model

    model = case_model(NODE_SUITE[name])
    ins, outs = case_data(NODE_SUITE[name])[0]
    sess = _cuda_only(model)
    assert sess.capture_plan().mode == "whole", sess.capture_plan().format()
    feeds = dict(zip([i.name for i in model.graph.input], ins))
    for _ in range(4):  # warm-up, capture, replays
        got = sess.run(None, feeds)
        bad = []
        for arg, g, w in zip(sess.get_outputs(), got, outs, strict=True):
            bad += [
                r.describe() for r in compare_output(arg.name, g, w, "cuda", "onnx") if not r.ok
            ]
        assert not bad, "\n".join(bad)
    s = sess.capture_stats()
    assert s["captures"] == 1 and s["replays"] >= 1 and s["fallbacks"] == 0, s


@pytest.mark.parametrize("cid", sorted(OWN))
def test_own_cases_match_the_cpu_provider(cid):
    case = OWN[cid]
    model = cases.case_model(case)
    feeds = cases.case_feeds(case)
    sess = _cuda_only(model)
    assert sess.capture_plan().mode == "whole", sess.capture_plan().format()
    want = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"]).run(None, feeds)
    for _ in range(4):  # warm-up, capture, a replay
        got = sess.run(None, feeds)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype
            np.testing.assert_allclose(
                g.astype(np.float32), w.astype(np.float32), **cases.tolerance(case.dtype)
            )
    s = sess.capture_stats()
    assert s["captures"] == 1 and s["replays"] >= 1 and s["fallbacks"] == 0, s


@pytest.mark.parametrize("case", cases.BAD_LENS, ids=lambda c: c.id)
def test_a_bad_sequence_length_raises_eager_and_captured(case):
    model = cases.case_model(case)
    feeds = cases.case_feeds(case)
    good = {**feeds, "sequence_lens": np.clip(feeds["sequence_lens"], 0, case.steps)}
    want = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"]).run(None, good)
    for capture in ("off", "whole"):
        sess = _cuda_only(model, capture)
        for _ in range(3):  # a captured graph reports as the eager kernel does
            got = sess.run(None, good)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        with pytest.raises(BoundsError, match=r"sequence_lens values must be in \[0, 5\]"):
            sess.run(None, feeds)
        got = sess.run(None, good)  # the session stays usable
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)


def test_a_hidden_size_past_a_block_is_a_seam_with_its_reason():
    case = cases.RnnCase("rnn-wide", "RNN", steps=3, batch=2, inputs=4, hidden=1100)
    model = cases.case_model(case)
    opts = onnxep.SessionOptions(disable_fallback=True)
    sess = onnxep.InferenceSession(model.SerializeToString(), opts, [("cuda", {"capture": "auto"})])
    seams = sess.capture_plan().seams
    assert len(seams) == 1 and "hidden_size 1100 is past the 1024 units" in seams[0].reason, seams
    feeds = cases.case_feeds(case)
    want = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"]).run(None, feeds)
    for g, w in zip(sess.run(None, feeds), want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("batch", [1, 4])
def test_a_conv1d_lstm_voice_activity_model_is_one_graph(batch):
    """Conv1d + LSTM (as torch exports VoiceActivity): the whole model one CUDA graph, its
    replays equal to onnxruntime's."""
    model = cases.voice_activity_model()
    sess = onnxep.InferenceSession(
        model.SerializeToString(), providers=[("cuda", {"capture": "whole"}), "cpu"]
    )
    plan = sess.capture_plan()
    assert plan.mode == "whole", plan.format()
    (lstm,) = [p for p in sess.placement() if p.op_type == "LSTM"]
    assert lstm.provider == "cuda", lstm
    ref = ort.InferenceSession(model.SerializeToString())
    rng = np.random.default_rng(batch)
    for _ in range(5):
        audio = rng.uniform(-1, 1, (batch, 1, 1600)).astype(np.float32)
        (got,) = sess.run(None, {"audio": audio})
        (want,) = ref.run(None, {"audio": audio})
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    s = sess.capture_stats()
    assert s["captures"] == 1 and s["replays"] >= 2 and s["fallbacks"] == 0, s
