"""Run-time values past the table they index raise one clear error (issue 16, section 4).

A Qwen2-shaped export from onnxruntime-genai's builder (tests/data/genai/qwen2_fp32, a
cos_cache of 256 rows) run past its rotary cache, and one-node GroupQueryAttention models
fed a seqlens_k past the KV cache, position ids outside the cache and bad query_seqlens:
each raises a BoundsError naming the node, the value, the limit and what to change, where
onnxruntime (in the same test) refuses too, and the session runs a valid feed afterwards.
The CUDA provider decodes its device error record into the same sentences
(tests/test_bounds_cuda_emulated.py, tests/cuda/test_cuda_bounds.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import onnxep
from onnxep.errors import BoundsError, RunError
from onnxep.providers import bounds

GENAI = Path(__file__).parent / "data" / "genai" / "qwen2_fp32" / "model.onnx"
ROWS = 256  # the export's cos_cache rows (its max_position_embeddings)
GQA = "GroupQueryAttention"


def genai_feeds(n: int, past: int = 0) -> dict[str, np.ndarray]:
    f = {
        "input_ids": (np.arange(n, dtype=np.int64)[None] * 7) % 500,
        "attention_mask": np.ones((1, n + past), np.int64),
    }
    rng = np.random.default_rng(past)
    for i in range(2):
        for kind in ("key", "value"):
            f[f"past_key_values.{i}.{kind}"] = rng.standard_normal((1, 2, past, 64)).astype(
                np.float32
            )
    return f


def _refused_by_onnxruntime(model, feeds, match: str) -> None:
    sess = ort.InferenceSession(model if isinstance(model, bytes) else str(model))
    with pytest.raises(Exception, match=match):
        sess.run(None, feeds)


def test_a_prompt_past_the_rotary_cache_names_its_first_position():
    sess = onnxep.InferenceSession(GENAI, providers=["cpu"])
    node = "/model/layers.0/attn/GroupQueryAttention"
    with pytest.raises(BoundsError) as info:
        sess.run(None, genai_feeds(300))
    want = f"{GQA} node {node!r}: " + bounds.position_text(256, ROWS, "token 256 of batch row 0")
    assert str(info.value) == want
    assert "max_position_embeddings" in want and "within 256 tokens" in want
    _refused_by_onnxruntime(GENAI, genai_feeds(300), "cos_cache dimension 0")
    # the session goes on: the longest prompt the cache holds runs as onnxruntime runs it
    f = genai_feeds(ROWS)
    got = sess.run(None, f)[0]
    want_logits = ort.InferenceSession(str(GENAI)).run(None, f)[0]
    np.testing.assert_allclose(got, want_logits, atol=1e-4, rtol=1e-3)


def test_a_decode_step_past_the_rotary_cache_is_refused():
    sess = onnxep.InferenceSession(GENAI, providers=["cpu"])
    with pytest.raises(BoundsError, match=r"position 256 \(token 0 of batch row 0\) is past"):
        sess.run(None, genai_feeds(1, past=ROWS))
    _refused_by_onnxruntime(GENAI, genai_feeds(1, past=ROWS), "cos_cache dimension 0")
    sess.run(None, genai_feeds(1, past=ROWS - 1))


@pytest.mark.parametrize("share_on_host", [False, True], ids=["growing", "fixed_capacity"])
def test_generate_past_the_rotary_cache_raises_and_the_session_goes_on(share_on_host):
    from onnxep.generation.greedy import GreedyDecoder

    sess = onnxep.InferenceSession(GENAI, providers=["cpu"])
    prompt = (np.arange(250, dtype=np.int64) * 3) % 500
    with pytest.raises(BoundsError, match=r"position 256 \(token 0 of batch row 0\).*256 rows"):
        # fixed capacity: total_sequence_length is 270 from the first step (onnxruntime
        # refuses that at once); only the token at position 256 is past the cache
        dec = GreedyDecoder(sess, prompt, 20, capacity=270, share_on_host=share_on_host)
        while not dec.done:
            dec.step()
    assert len(onnxep.generate(sess, prompt[:100], 4, progress=False).tokens) == 4


# ----------------------------------------------------------------------------- one node


NAMES = ["query", "key", "value", "past_key", "past_value", "seqlens_k",
         "total_sequence_length", "cos_cache", "sin_cache", "position_ids"]  # fmt: skip
INT_INPUTS = {"seqlens_k": TensorProto.INT32, "total_sequence_length": TensorProto.INT32,
              "position_ids": TensorProto.INT64, "query_seqlens": TensorProto.INT32}  # fmt: skip


def gqa_model(names, attrs, name="gqa") -> bytes:
    node = helper.make_node(GQA, names, ["y", "pk", "pv"], domain="com.microsoft", name=name,
                            **attrs)  # fmt: skip
    ins = [helper.make_tensor_value_info(n, INT_INPUTS.get(n, TensorProto.FLOAT), None)
           for n in names if n]  # fmt: skip
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "pk", "pv")]
    graph = helper.make_graph([node], "g", ins, outs)
    imports = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    m = helper.make_model(graph, opset_imports=imports)
    m.ir_version = 10
    return m.SerializeToString()


def gqa_feeds(b=1, s=1, cap=8, seqlens=(5,), total=8, rows=16, pos=None, nh=4, nkv=2, d=16):
    """A step of ``s`` tokens per row over a shared cache of ``cap`` rows."""
    rng = np.random.default_rng(0)
    r = rng.standard_normal
    f = {
        "query": r((b, s, nh * d)).astype(np.float32),
        "key": r((b, s, nkv * d)).astype(np.float32),
        "value": r((b, s, nkv * d)).astype(np.float32),
        "past_key": r((b, nkv, cap, d)).astype(np.float32),
        "past_value": r((b, nkv, cap, d)).astype(np.float32),
        "seqlens_k": np.array(seqlens, np.int32),
        "total_sequence_length": np.array(total, np.int32),
    }
    ang = np.arange(rows)[:, None] * (1.0 / 10000 ** (np.arange(0, d, 2) / d))[None]
    f["cos_cache"], f["sin_cache"] = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    if pos is not None:
        f["position_ids"] = np.array(pos, np.int64)
    return f


ATTRS = {"num_heads": 4, "kv_num_heads": 2, "do_rotary": 1}

#: name, feeds, expected sentence (after the node's name), what onnxruntime says
REFUSED = [
    ("seqlens_past_capacity", gqa_feeds(seqlens=(8,)),
     bounds.kv_length_text(0, 8, 8, 8), r"seqlens_k\[0\] = 8 is out of range"),
    ("seqlens_below_minus_one", gqa_feeds(seqlens=(-2,)),
     bounds.kv_length_text(0, -2, 8, 8), r"seqlens_k\[0\] = -2"),
    ("second_row_past_capacity", gqa_feeds(b=2, seqlens=(3, 9)),
     bounds.kv_length_text(1, 9, 8, 8), r"seqlens_k\[1\] = 9"),
    ("position_id_past_cache", gqa_feeds(b=2, seqlens=(3, 4), pos=[[3], [16]]),
     bounds.position_text(16, 16, "position_ids[1, 0]"), "position_ids value 16"),
    ("position_id_negative", gqa_feeds(pos=[[-1]]),
     bounds.position_text(-1, 16, "position_ids[0, 0]"), "position_ids value -1"),
    ("seqlens_position_past_cache", gqa_feeds(cap=32, seqlens=(20,), total=32, rows=16),
     bounds.position_text(20, 16, "token 0 of batch row 0"), "cos_cache dimension 0"),
    ("prompt_crossing_the_cache", gqa_feeds(s=6, cap=16, seqlens=(5,), total=6, rows=4),
     bounds.position_text(4, 4, "token 4 of batch row 0"), "cos_cache dimension 0"),
]  # fmt: skip


@pytest.mark.parametrize("case", REFUSED, ids=[c[0] for c in REFUSED])
def test_gqa_refuses_what_onnxruntime_refuses_with_one_sentence(case):
    name, feeds, text, ort_says = case
    names = NAMES if "position_ids" in feeds else NAMES[:9]
    model = gqa_model(names, ATTRS)
    f = {n: feeds[n] for n in names}
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    with pytest.raises(BoundsError) as info:
        sess.run(None, f)
    assert str(info.value) == f"{GQA} node 'gqa': {text}"
    assert isinstance(info.value, RunError) and isinstance(info.value, IndexError)
    _refused_by_onnxruntime(model, f, ort_says)
    (b, s, _), cap = f["query"].shape, f["past_key"].shape[2]
    pos = np.full((b, s), 2) if "position_ids" in f else None
    good = gqa_feeds(b, s, cap, seqlens=(max(2, s - 1),) * b, total=max(3, s), pos=pos)
    good = {n: good[n] for n in names}
    got, want = sess.run(None, good), ort.InferenceSession(model).run(None, good)
    np.testing.assert_allclose(got[0], want[0], atol=1e-5, rtol=1e-4)
    # the cache rows a row holds (onnxruntime zeroes the shared buffer's rows past them)
    np.testing.assert_allclose(got[1][:, :, :3], want[1][:, :, :3], atol=1e-5, rtol=1e-4)


def test_gqa_attends_seqlens_k_tokens_past_total_sequence_length_as_onnxruntime_does():
    """total_sequence_length sizes the present cache; a row attends its seqlens_k + 1 tokens
    (onnxruntime runs this, so it is not refused: only the cache's capacity bounds them)."""
    model = gqa_model(NAMES[:9], ATTRS)
    f = {n: v for n, v in gqa_feeds(seqlens=(6,), total=5).items() if n in NAMES[:9]}
    got = onnxep.InferenceSession(model, providers=["cpu"]).run(None, f)
    want = ort.InferenceSession(model).run(None, f)
    np.testing.assert_allclose(got[0], want[0], atol=1e-5, rtol=1e-4)


def test_query_seqlens_past_the_step_or_the_row_is_refused():
    names = [*NAMES[:9], "", "", "", "", "", "", "", "query_seqlens"]
    model = gqa_model(names, ATTRS)
    f = gqa_feeds(b=2, s=3, cap=16, seqlens=(6, 1), total=16)
    f["query_seqlens"] = np.array([3, 3], np.int32)  # row 1 holds 2 tokens: at most 2 new
    feeds = {n: f[n] for n in names if n}
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    with pytest.raises(BoundsError) as info:
        sess.run(None, feeds)
    assert str(info.value) == f"{GQA} node 'gqa': " + bounds.query_length_text(1, 3, 2, 3)
    sess.run(None, {**feeds, "query_seqlens": np.array([3, 2], np.int32)})


def test_the_sentences_say_value_limit_and_fix():
    assert bounds.position_text(4200, 4096, "token 3 of batch row 0") == (
        "position 4200 (token 3 of batch row 0) is past the rotary cache's 4096 rows "
        "(cos_cache); export the model with a larger max_position_embeddings or keep the "
        "context within 4096 tokens"
    )
    assert "is negative" in bounds.position_text(-3, 10, "position_ids[0, 1]")
    kv = bounds.kv_length_text(1, 300, 256, 256)
    assert kv.startswith("seqlens_k[1] = 300 asks for 301 tokens, past the KV cache's 256 rows")
    assert "larger capacity" in kv
    assert "attention_bias" in bounds.kv_length_text(0, 40, 33, 64)
    assert "below -1" in bounds.kv_length_text(0, -5, 8, 8)


def test_matmul_nbits_g_idx_past_the_groups_is_refused():
    k, n, block = 32, 4, 16
    rng = np.random.default_rng(1)
    feeds = {
        "a": rng.standard_normal((1, k)).astype(np.float32),
        "g": (np.arange(k) // block).astype(np.int32),
    }
    node = helper.make_node("MatMulNBits", ["a", "w", "s", "", "g"], ["y"],
                            domain="com.microsoft", K=k, N=n, bits=4, block_size=block)  # fmt: skip
    inits = [
        helper.make_tensor("w", TensorProto.UINT8, (n, k // block, block // 2),
                           rng.integers(0, 255, (n, k // block, block // 2)).reshape(-1).tolist()),
        helper.make_tensor("s", TensorProto.FLOAT, (n * k // block,),
                           rng.random(n * k // block).tolist()),
    ]  # fmt: skip
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, k]),
         helper.make_tensor_value_info("g", TensorProto.INT32, [k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    imports = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    m = helper.make_model(graph, opset_imports=imports)
    m.ir_version = 10
    sess = onnxep.InferenceSession(m.SerializeToString(), providers=["cpu"])
    want = ort.InferenceSession(m.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(sess.run(None, feeds)[0], want, atol=1e-4, rtol=1e-4)
    bad = feeds["g"].copy()
    bad[7] = 2
    with pytest.raises(RunError, match=r"g_idx value 2 at g_idx\[7\].*the 2 quantization groups"):
        sess.run(None, {**feeds, "g": bad})
    bad[7] = -1  # used to wrap round to the last group
    with pytest.raises(RunError, match=r"g_idx value -1 at g_idx\[7\]"):
        sess.run(None, {**feeds, "g": bad})
