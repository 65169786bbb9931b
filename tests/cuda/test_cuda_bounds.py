"""Values past their tables on the GPU: the CPU's sentence, eager and captured (issue 16 s4).

The CUDA kernels check rotary positions, seqlens_k and query_seqlens on the device and write
a bad one into the provider's error record, which raises at the run's next read of its
results. Each case here runs on a CUDA session and on a CPU session: both raise a
BoundsError with the same text, and the CUDA session then runs a valid feed to the CPU's
result. Captured: a CUDA graph replayed with values out of range raises at that run, and
the next replay with good values is right (the record was cleared, the graph kept).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_bounds import ATTRS, GENAI, NAMES, REFUSED, ROWS, genai_feeds, gqa_feeds, gqa_model

import onnxep
from onnxep.errors import BoundsError

F16 = np.float16


def _cuda(model, capture="off", **extra):
    opts = onnxep.SessionOptions(disable_fallback=True)
    return onnxep.InferenceSession(model, opts, providers=[("cuda", {"capture": capture, **extra})])


def _same_error(cuda_sess, cpu_sess, feeds) -> str:
    with pytest.raises(BoundsError) as cpu:
        cpu_sess.run(None, feeds)
    with pytest.raises(BoundsError) as gpu:
        cuda_sess.run(None, feeds)
    assert str(gpu.value) == str(cpu.value)
    return str(gpu.value)


def _good(feeds, names):
    (b, s, _), cap = feeds["query"].shape, feeds["past_key"].shape[2]
    pos = np.full((b, s), 2) if "position_ids" in feeds else None
    total, rows = int(feeds["total_sequence_length"]), feeds["cos_cache"].shape[0] + 8
    good = gqa_feeds(b, s, cap, seqlens=(max(2, s - 1),) * b, total=total, rows=rows, pos=pos)
    return {n: good[n] for n in names}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("case", REFUSED, ids=[c[0] for c in REFUSED])
def test_gqa_raises_the_cpu_sentence_and_stays_usable(case, dtype):
    name, feeds, text, _ = case
    names = NAMES if "position_ids" in feeds else NAMES[:9]
    model = gqa_model(names, ATTRS)
    f = {n: feeds[n] for n in names}
    if dtype == "float16":
        model, f = _half(model, f)
    gpu, cpu = _cuda(model), onnxep.InferenceSession(model, providers=["cpu"])
    assert _same_error(gpu, cpu, f) == f"GroupQueryAttention node 'gqa': {text}"
    good = _good(feeds, names)
    if dtype == "float16":
        good = {n: v.astype(F16) if v.dtype == np.float32 else v for n, v in good.items()}
    got, want = gpu.run(None, good), cpu.run(None, good)
    tol = 2.5e-3 if dtype == "float16" else 2e-5
    np.testing.assert_allclose(got[0].astype(np.float32), want[0], atol=tol, rtol=1e-3)


def _half(model: bytes, feeds):
    import onnx

    m = onnx.load_from_string(model)
    for v in [*m.graph.input, *m.graph.output]:
        if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            v.type.tensor_type.elem_type = onnx.TensorProto.FLOAT16
    f = {n: a.astype(F16) if a.dtype == np.float32 else a for n, a in feeds.items()}
    return m.SerializeToString(), f


def test_a_genai_prompt_and_a_decode_step_past_the_cache_raise_as_on_the_cpu():
    gpu = _cuda(str(GENAI))
    cpu = onnxep.InferenceSession(GENAI, providers=["cpu"])
    msg = _same_error(gpu, cpu, genai_feeds(300))
    assert "position 256 (token 256 of batch row 0) is past the rotary cache's 256 rows" in msg
    _same_error(gpu, cpu, genai_feeds(1, past=ROWS))
    f = genai_feeds(ROWS)
    np.testing.assert_allclose(gpu.run(None, f)[0], cpu.run(None, f)[0], atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("capture", ["off", "auto"])
def test_generate_past_the_rotary_cache_raises_eager_and_captured(capture):
    """onnxep.generate's fixed-capacity decode: the step whose token sits at position 256
    raises (captured: a replay of the one decode graph), and the session decodes again."""
    sess = _cuda(str(GENAI), capture)
    prompt = (np.arange(240, dtype=np.int64) * 3) % 500
    with pytest.raises(BoundsError, match=r"position 256 \(token 0 of batch row 0\).*256 rows"):
        onnxep.generate(sess, prompt, 30, capacity=280, progress=False)
    stats = sess.capture_stats()
    if capture == "auto":
        assert stats["captures"] >= 1 and stats["replays"] >= 1, stats
    short = prompt[:100]
    cpu = onnxep.generate(onnxep.InferenceSession(GENAI, providers=["cpu"]), short, 8)
    got = onnxep.generate(sess, short, 8, capacity=280, progress=False)
    assert got.tokens == cpu.tokens


def _masked_gqa_model() -> bytes:
    """GroupQueryAttention whose total_sequence_length is the attention mask's width, as
    genai exports compute it (host shape math, so the step can be captured)."""
    import onnx
    from onnx import TensorProto, helper

    m = onnx.load_from_string(gqa_model(NAMES[:9], ATTRS))
    g = m.graph
    g.input.remove(next(i for i in g.input if i.name == "total_sequence_length"))
    g.input.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [1, None]))
    one = helper.make_tensor("one", TensorProto.INT64, [], [1])
    g.initializer.append(one)
    nodes = [
        helper.make_node("Shape", ["attention_mask"], ["mask_shape"]),
        helper.make_node("Gather", ["mask_shape", "one"], ["width"], axis=0),
        helper.make_node("Cast", ["width"], ["total_sequence_length"], to=TensorProto.INT32),
    ]
    for n in reversed(nodes):
        g.node.insert(0, n)
    return m.SerializeToString()


def test_a_captured_step_raises_at_the_bad_replay_and_replays_right_after():
    """One-node shared-cache decode captured whole: replays with new seqlens_k, one past the
    capacity (raises at that run), then good ones again (the same graph, the right answer)."""
    names = NAMES[:9]
    model = _masked_gqa_model()
    cpu = onnxep.InferenceSession(model, providers=["cpu"])
    sess = _cuda(model, "whole")
    base = {
        n: v for n, v in gqa_feeds(cap=64, seqlens=(5,), total=64, rows=128).items() if n in names
    }
    del base["total_sequence_length"]
    base["attention_mask"] = np.ones((1, 64), np.int64)
    for seq in (5, 6, 7, 8):  # warm-up runs, the capture, a replay
        f = {**base, "seqlens_k": np.array([seq], np.int32)}
        np.testing.assert_allclose(sess.run(None, f)[0], cpu.run(None, f)[0], atol=2e-5)
    replays = sess.capture_stats()["replays"]
    bad = {**base, "seqlens_k": np.array([64], np.int32)}
    msg = _same_error(sess, cpu, bad)
    assert "seqlens_k[0] = 64 asks for 65 tokens, past the KV cache's 64 rows" in msg
    for seq in (30, 63):
        f = {**base, "seqlens_k": np.array([seq], np.int32)}
        np.testing.assert_allclose(sess.run(None, f)[0], cpu.run(None, f)[0], atol=2e-5)
    s = sess.capture_stats()
    # the bad run raised after its replay (not counted); the graph stayed and replays
    assert s["captures"] == 1 and s["replays"] == replays + 2 and s["fallbacks"] == 0, s


def test_rotary_embedding_raises_the_cpu_sentence_eager_and_captured():
    from onnx import TensorProto, helper

    node = helper.make_node("RotaryEmbedding", ["x", "p", "c", "s"], ["y"], name="rope",
                            domain="com.microsoft", num_heads=2)  # fmt: skip
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 32]),
         helper.make_tensor_value_info("p", TensorProto.INT64, [1, 4]),
         helper.make_tensor_value_info("c", TensorProto.FLOAT, [24, 8]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [24, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    imports = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=imports).SerializeToString()
    rng = np.random.default_rng(5)
    ang = np.arange(24)[:, None] * rng.random(8)[None]
    f = {"x": rng.standard_normal((1, 4, 32)).astype(np.float32),
         "c": np.cos(ang).astype(np.float32), "s": np.sin(ang).astype(np.float32)}  # fmt: skip
    cpu = onnxep.InferenceSession(model, providers=["cpu"])
    for capture in ("off", "whole"):
        sess = _cuda(model, capture)
        for start in (0, 3, 7, 9):
            g = {**f, "p": np.arange(start, start + 4)[None]}
            np.testing.assert_allclose(sess.run(None, g)[0], cpu.run(None, g)[0], atol=1e-5)
        msg = _same_error(sess, cpu, {**f, "p": np.array([[20, 22, 24, 25]])})
        assert "position 24 (position_ids[0, 2]) is past the rotary cache's 24 rows" in msg
        g = {**f, "p": np.arange(2, 6)[None]}
        np.testing.assert_allclose(sess.run(None, g)[0], cpu.run(None, g)[0], atol=1e-5)
        if capture == "whole":
            assert sess.capture_stats()["captures"] == 1, sess.capture_stats()


assert Path(GENAI).is_file(), GENAI
