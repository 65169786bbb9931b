"""onnxep.serve.replica in this process (no Ray): what one replica answers.

Batched runs give each request what a local session gives it alone (to float
rounding: the joined run's BLAS sums in another order for another row count);
a model with no batch axis runs one by one and its report says why; a bad
request in a batch gets the session's own sentence and leaves the others
theirs. Completions give the Generator's text, whole and streamed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from text_models import make_text_folder

import onnxep
from onnxep.serve import Limits, ModelReplica, RequestError
from onnxep.serve.batching import Request
from onnxep.serve.completions import parse_request

DATA = Path(__file__).parent / "data"
RESNET = DATA / "resnet_cnn.onnx"


@pytest.fixture(scope="module")
def resnet():
    return ModelReplica(RESNET, providers=["cpu"])


@pytest.fixture(scope="module")
def local():
    return onnxep.InferenceSession(str(RESNET), providers=["cpu"])


def _images(rng, n, dtype=np.float32):
    return rng.standard_normal((n, 3, 64, 64)).astype(dtype)


def test_a_batch_gives_each_request_its_local_result(resnet, local):
    rng = np.random.default_rng(0)
    reqs = [Request({"image": _images(rng, n)}) for n in (1, 3, 2, 1)]
    before = resnet.runner.runs
    answers = resnet.infer_batch(reqs)
    assert resnet.runner.runs == before + 1  # one run for the four
    for req, ans in zip(reqs, answers):
        (want,) = local.run(None, req.feeds)
        assert ans["logits"].shape == want.shape
        np.testing.assert_allclose(ans["logits"], want, rtol=1e-5, atol=1e-6)
    # alone, the same run as the local session's: the same bits
    alone = resnet.infer(reqs[1])
    assert alone["logits"].tobytes() == local.run(None, reqs[1].feeds)[0].tobytes()
    report = resnet.report()
    assert report["batching"]["axis"] == 0
    assert (
        report["batching"]["how"] == "concatenated along axis 0 ('batch' of every input and output)"
    )


def test_a_bad_request_gets_the_sessions_sentence_and_the_others_their_results(resnet, local):
    rng = np.random.default_rng(1)
    good = [Request({"image": _images(rng, 2)}) for _ in range(2)]
    wrong_dtype = Request({"image": _images(rng, 1, np.float64)})
    unknown = Request({"image": _images(rng, 1), "extra": _images(rng, 1)})
    wrong_shape = Request({"image": rng.standard_normal((1, 3, 32, 64)).astype(np.float32)})
    batch = [good[0], wrong_dtype, unknown, wrong_shape, good[1]]
    answers = resnet.infer_batch(batch)
    for i in (1, 2, 3):
        err = answers[i]
        assert isinstance(err, RequestError) and err.status == 400
        with pytest.raises(onnxep.errors.InvalidArgument) as info:
            local.run(None, batch[i].feeds)
        assert err.message == str(info.value)
    for req, ans in zip(good, (answers[0], answers[4])):
        # Alone, a request's two rows meet the classifier's Gemm as one GEMV each; batched,
        # its rows are among four, one SGEMM (providers_cpu/ops/few_rows.py): the same values
        # to float32 rounding, not the same bits (a logit of 1.4e-3 differed by 2.4e-8).
        want = local.run(None, req.feeds)[0]
        np.testing.assert_allclose(ans["logits"], want, rtol=1e-5, atol=1e-6)
    # a batch whose joined run fails serves each alone: a wrong channel count in every one
    bad = [Request({"image": rng.standard_normal((1, 2, 64, 64)).astype(np.float32)})] * 2
    assert all(isinstance(a, RequestError) and a.status == 400 for a in resnet.infer_batch(bad))


def test_rows_over_the_limit_are_a_422_naming_it():
    small = ModelReplica(RESNET, providers=["cpu"], limits=Limits(max_rows=2))
    req = Request({"image": np.zeros((3, 3, 64, 64), np.float32)})
    err = small.infer(req)
    assert isinstance(err, RequestError) and err.status == 422
    assert "rows along the batch axis (0) is 3, over this server's limit of 2 (max_rows" in (
        err.message
    )


def test_a_model_without_a_batch_axis_runs_one_by_one_and_says_why(local):
    so = onnxep.SessionOptions()
    so.add_free_dimension_override_by_name("batch", 1)
    fixed = ModelReplica(RESNET, providers=["cpu"], sess_options=so)
    assert fixed.report()["batching"]["how"] == (
        "run one by one: input 'image' fixes dim 0 to 1 ([1, 3, 64, 64])"
    )
    rng = np.random.default_rng(2)
    reqs = [Request({"image": _images(rng, 1)}) for _ in range(3)]
    before = fixed.runner.runs
    for req, ans in zip(reqs, fixed.infer_batch(reqs)):
        assert ans["logits"].tobytes() == local.run(None, req.feeds)[0].tobytes()
    assert fixed.runner.runs == before + 3
    off = ModelReplica(RESNET, providers=["cpu"], batch_axis=None)
    assert off.axis.axis is None and "batch_axis=None" in off.axis.reason


def test_requests_join_only_with_the_same_dims_off_the_batch_axis():
    model = DATA / "hf_llama.onnx"  # input_ids, attention_mask: [batch, seq]
    rep = ModelReplica(model, providers=["cpu"])
    local = onnxep.InferenceSession(str(model), providers=["cpu"])
    rng = np.random.default_rng(3)

    def req(b, s):
        ids = rng.integers(0, 512, (b, s)).astype(np.int64)
        return Request({"input_ids": ids, "attention_mask": np.ones((b, s), np.int64)})

    reqs = [req(1, 5), req(2, 7), req(1, 5), req(1, 7)]
    before = rep.runner.runs
    answers = rep.infer_batch(reqs)
    assert rep.runner.runs == before + 2  # seq 5 joined, seq 7 joined
    for r, a in zip(reqs, answers):
        np.testing.assert_allclose(a["logits"], local.run(None, r.feeds)[0], rtol=1e-4, atol=1e-5)


# -- completions ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_text_folder(tmp_path_factory.mktemp("serve") / "qwen2")


@pytest.fixture(scope="module")
def text(folder):
    return ModelReplica(folder, providers=["cpu"], limits=Limits(max_prompt_tokens=100))


@pytest.fixture(scope="module")
def gen(folder):
    return onnxep.Generator(folder, providers=["cpu"])


def _job(doc, chat=False, limits=None):
    return parse_request(doc, limits or Limits(), chat=chat)


def _streamed(replica, job):
    chunks = list(replica.stream(job))
    assert not any(isinstance(c, RequestError) for c in chunks), chunks
    return chunks


def test_completions_give_the_generators_text_whole_and_streamed(text, gen):
    prompt = "Once upon a time"
    want = gen.generate(prompt, max_new_tokens=20)
    whole = text.complete(_job({"prompt": prompt, "max_tokens": 20}))
    assert whole["choices"][0]["text"] == want.text
    assert whole["choices"][0]["finish_reason"] == {"length": "length"}.get(
        want.finish_reason, "stop"
    )
    assert whole["usage"] == {
        "prompt_tokens": len(want.prompt_ids),
        "completion_tokens": len(want.token_ids),
        "total_tokens": len(want.prompt_ids) + len(want.token_ids),
    }
    job = _job(
        {
            "prompt": prompt,
            "max_tokens": 20,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    )
    chunks = _streamed(text, job)
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == want.text
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    json.dumps(chunks, allow_nan=False)  # every chunk is strict JSON


def test_chat_sampling_and_stop_follow_the_generator(text, gen):
    messages = [{"role": "user", "content": "What is your name?"}]
    sampled = {"temperature": 0.9, "top_k": 30, "top_p": 0.95, "seed": 4}
    want = gen.generate(messages, max_new_tokens=16, do_sample=True, **sampled)
    job = _job({"messages": messages, "max_tokens": 16, "stream": True, **sampled}, chat=True)
    chunks = _streamed(text, job)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    got = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert got == want.text
    whole = text.complete(_job({"messages": messages, "max_tokens": 16, **sampled}, chat=True))
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": want.text}
    stop = gen.generate("The quick brown fox", max_new_tokens=24).text[6:9]
    want = gen.generate("The quick brown fox", max_new_tokens=24, stop=stop)
    got = text.complete(_job({"prompt": "The quick brown fox", "max_tokens": 24, "stop": stop}))
    assert got["choices"][0]["text"] == want.text and got["choices"][0]["finish_reason"] == "stop"


def test_several_prompts_are_several_choices(text, gen):
    prompts = ["Hi", "Once upon a time, in a small town"]
    want = gen.generate(prompts, max_new_tokens=8)
    whole = text.complete(_job({"prompt": prompts, "max_tokens": 8}))
    assert [c["text"] for c in whole["choices"]] == [w.text for w in want]
    chunks = _streamed(text, _job({"prompt": prompts, "max_tokens": 8, "stream": True}))
    for i, w in enumerate(want):
        parts = [c["choices"][0]["text"] for c in chunks if c["choices"][0]["index"] == i]
        assert "".join(parts) == w.text


def test_completion_errors_are_the_generators_sentence_or_a_named_limit(text, tmp_path):
    long = text.complete(_job({"prompt": "Once upon a time " * 20, "max_tokens": 2}))
    assert (
        long.status == 422
        and "the prompt's length in tokens is 160, over this server's "
        "limit of 100 (max_prompt_tokens"
        in long.message
    )
    wide = ModelReplica(text.model, providers=["cpu"])
    past = wide.complete(_job({"prompt": "Once upon a time " * 80, "max_tokens": 2}))
    assert past.status == 400 and past.message.startswith(
        "the prompt is 640 tokens, and the model's context length (256) leaves no room"
    )
    over = text.complete(_job({"prompt": "Hi", "max_tokens": 300}))
    assert over.status == 400 and "pass the model's context length (256)" in over.message
    first = next(iter(text.stream(_job({"prompt": "Hi", "max_tokens": 300, "stream": True}))))
    assert isinstance(first, RequestError) and first.message == over.message
    other = text.complete(_job({"prompt": "Hi", "model": "gpt-4"}))
    assert other.status == 404 and "this server serves 'qwen2'" in other.message
    bad_id = text.complete(_job({"prompt": [5, 9999], "max_tokens": 2}))
    assert (
        bad_id.status == 400 and "token id 9999 is not in the model's vocabulary" in bad_id.message
    )
    no_text = ModelReplica(RESNET, providers=["cpu"])
    assert no_text.complete(_job({"prompt": "Hi"})).status == 404


@pytest.mark.parametrize(
    "doc, status, message",
    [
        ({"prompt": "x", "n": 2}, 400, "n=2 is not supported by onnxep serve"),
        ({"prompt": "x", "logprobs": 3}, 400, "logprobs=3 is not supported"),
        ({"prompt": "x", "frequency_penalty": 0.5}, 400, "give repetition_penalty instead"),
        (
            {"prompt": "x", "wat": 1},
            400,
            "unrecognized request argument(s) for /v1/completions: wat",
        ),
        ({"prompt": "x", "temperature": -1}, 400, "temperature must be a number of at least 0"),
        (
            {"prompt": "x", "top_p": 1.5},
            400,
            "top_p must be a number of at least 0.0 and at most 1",
        ),
        ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens must be a whole number of at least 1"),
        ({"prompt": "x", "max_tokens": 5000}, 422, "max_tokens is 5,000, over this server's limit"),
        ({"prompt": ["x"] * 300}, 422, "the number of prompts is 300, over this server's limit"),
        (
            {"prompt": "x", "stream_options": {"include_usage": True}},
            400,
            "only allowed with stream",
        ),
        ({"prompt": {"a": 1}}, 400, "prompt must be a string"),
        ({"prompt": "x", "stop": ""}, 400, "stop must be a non-empty string"),
    ],
)
def test_bad_completion_requests_are_refused_in_one_sentence(doc, status, message):
    with pytest.raises(RequestError) as info:
        _job(doc)
    assert info.value.status == status and message in info.value.message


def test_bad_chat_requests_are_refused_in_one_sentence():
    for doc, message in [
        ({"messages": []}, "messages must be a non-empty list"),
        ({"messages": [{"content": "x"}]}, 'must be an object with a "role" string'),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "only text parts"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, "tool"),
    ]:
        with pytest.raises(RequestError) as info:
            _job(doc, chat=True)
        assert message in info.value.message and info.value.status == 400
    job = _job(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                }
            ]
        },
        chat=True,
    )
    assert job.prompts == [[{"role": "user", "content": "ab"}]]
