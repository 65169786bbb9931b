"""``onnxep.Generator``: from a prompt string to text on a model folder, against onnxruntime-genai.

The folders are tests/data/genai's decoders with a tokenizer trained at test
time (tests/text_models.py). onnxruntime-genai runs the same folder: its
tokenizer must give the same prompt ids and its greedy search the same tokens.
Batches of prompts of different lengths must give every row the tokens it
gets alone; models that cannot take right padding are refused by name.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime_genai as og
import pytest
from text_models import CHAT_TEMPLATE, EOS_IDS, GENAI, make_text_folder, train_tokenizer

import onnxep
from onnxep.errors import InvalidArgument
from onnxep.generation.greedy import GreedyDecoder

DATA = Path(__file__).parent / "data"
PROMPTS = ["Once upon a time", "The quick brown fox", "What is your name?"]
CHAT = [{"role": "user", "content": "Where do you live?"}]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_text_folder(tmp_path_factory.mktemp("text") / "qwen2")


@pytest.fixture(scope="module")
def gen(folder) -> onnxep.Generator:
    return onnxep.Generator(folder, providers=["cpu"])


def genai_greedy(folder: Path, ids: list[int], new: int) -> list[int]:
    """onnxruntime-genai's greedy search on ``folder``: each step's new token id (its
    sequence leaves out the end token that finishes the search; its next tokens do not)."""
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + new, do_sample=False)
    g = og.Generator(model, params)
    g.append_tokens(np.array(ids, np.int32))
    out = []
    while not g.is_done():
        g.generate_next_token()
        out.append(int(g.get_next_tokens()[0]))
    return out


def genai_encode(folder: Path, text: str) -> list[int]:
    return [int(t) for t in og.Tokenizer(og.Model(str(folder))).encode(text)]


# -- the same tokens as onnxruntime-genai ---------------------------------------------------


@pytest.mark.parametrize("prompt", PROMPTS)
def test_text_matches_onnxruntime_genai_greedy(gen, folder, prompt):
    r = gen.generate(prompt, max_new_tokens=24)
    assert r.prompt_ids == genai_encode(folder, prompt)
    assert r.token_ids == genai_greedy(folder, r.prompt_ids, 24)
    assert r.finish_reason == "length" and len(r.token_ids) == 24
    assert r.text == train_tokenizer().decode(r.token_ids, skip_special_tokens=True)
    s = r.stats
    assert s.prompt_tokens == [len(r.prompt_ids)] and s.new_tokens == [24]
    assert s.time_to_first_token_ms > 0 and s.decode_tokens_per_second > 0
    assert "tokens/s" in s.summary() and s.run.token_ids.shape == (1, 24)


def test_a_chat_goes_through_the_template_as_genai_renders_it(gen, folder):
    tok = og.Tokenizer(og.Model(str(folder)))
    text = tok.apply_chat_template(json.dumps(CHAT), add_generation_prompt=True)
    assert gen.tokenizer.apply_chat_template(CHAT) == text
    r = gen.generate(CHAT, max_new_tokens=16)
    assert r.prompt_ids == [int(t) for t in tok.encode(text)]
    assert r.prompt_ids[:1] == [1]  # <|im_start|> as the special token, not its characters
    assert r.token_ids == genai_greedy(folder, r.prompt_ids, 16)
    # a string with chat=True is the user's message; system= comes first
    assert gen.encode("Where do you live?", chat=True) == r.prompt_ids
    with_system = gen.encode("Hi", chat=True, system="Be brief.")
    assert gen.tokenizer.decode(with_system, skip_special_tokens=False).startswith(
        "<|im_start|>system\nBe brief.<|im_end|>"
    )


def test_the_end_of_sequence_id_ends_the_row_as_in_genai(tmp_path, gen):
    ids = gen.encode(PROMPTS[0])
    free = gen.generate(ids, max_new_tokens=12).token_ids
    eos = free[5]
    stop_at = free.index(eos)
    folder = make_text_folder(tmp_path / "m", model={"eos_token_id": eos})
    r = onnxep.Generator(folder, providers=["cpu"]).generate(ids, max_new_tokens=12)
    assert r.finish_reason == "eos"
    assert r.token_ids == free[: stop_at + 1]  # the end token is the last one
    assert r.token_ids == genai_greedy(folder, ids, 12)
    # eos_token_ids= overrides the folder's; [] turns it off
    assert gen.generate(ids, max_new_tokens=12, eos_token_ids=[eos]).token_ids == r.token_ids
    assert gen.generate(ids, max_new_tokens=12, eos_token_ids=[]).token_ids == free


def test_hybrid_folder_gives_the_reference_tokens(tmp_path):
    # onnxruntime-genai 0.18 cannot run it (3-D position_ids); the reference tokens were
    # recorded from onnxruntime (tests/data/genai/qwen3_5_tokens.json)
    ref = json.loads((GENAI / "qwen3_5_tokens.json").read_text())
    folder = make_text_folder(tmp_path / "h", "qwen3_5_fp32")
    gen = onnxep.Generator(folder, providers=["cpu"])
    r = gen.generate(ref["prompt"], max_new_tokens=len(ref["tokens"]), eos_token_ids=[])
    assert r.token_ids == ref["tokens"]
    assert r.text == gen.tokenizer.decode(ref["tokens"])


def test_search_defaults_come_from_genai_config(tmp_path, gen):
    ids = gen.encode(PROMPTS[1])
    # max_length counts the prompt, as in onnxruntime-genai
    folder = make_text_folder(tmp_path / "a", search={"max_length": len(ids) + 5})
    short = onnxep.Generator(folder, providers=["cpu"])
    r = short.generate(ids)
    assert len(r.token_ids) == 5 and r.token_ids == genai_greedy(folder, ids, 5)
    # do_sample with top_k, temperature and a seed from the folder sample by default
    sampled = {"do_sample": True, "top_k": 40, "temperature": 1.5, "random_seed": 7}
    folder = make_text_folder(tmp_path / "b", search=sampled)
    r = onnxep.Generator(folder, providers=["cpu"]).generate(ids, max_new_tokens=12)
    expect = gen.generate(ids, max_new_tokens=12, do_sample=True, top_k=40, temperature=1.5, seed=7)
    assert r.token_ids == expect.token_ids
    assert r.token_ids != gen.generate(ids, max_new_tokens=12).token_ids
    # temperature 0 or top_k 1 is greedy whatever do_sample says
    greedy = gen.generate(ids, max_new_tokens=12).token_ids
    for opts in ({"temperature": 0.0}, {"top_k": 1}, {"do_sample": False}):
        merged = {**dict(do_sample=True, temperature=1.5, seed=3), **opts}
        assert gen.generate(ids, max_new_tokens=12, **merged).token_ids == greedy


# -- sampling -------------------------------------------------------------------------------


def test_sampling_is_reproducible_by_seed(gen):
    opts = dict(max_new_tokens=16, do_sample=True, temperature=1.2, top_p=0.95, top_k=0)
    a = gen.generate(PROMPTS[0], seed=11, **opts).token_ids
    assert gen.generate(PROMPTS[0], seed=11, **opts).token_ids == a
    assert gen.generate(PROMPTS[0], seed=12, **opts).token_ids != a


def test_repetition_penalty_matches_a_host_loop(gen, folder):
    """transformers' definition, applied on the host to plain runs' logits."""
    from onnxep.generation.spec import DecodeState, decode_spec, model_dims

    ids = gen.encode(PROMPTS[2])
    sess = onnxep.InferenceSession(str(folder / "model.onnx"), providers=["cpu"])
    spec = decode_spec(sess.get_inputs(), sess.get_outputs())
    names = [o.name for o in sess.get_outputs()]
    state = DecodeState(spec, len(ids), prompt=np.array(ids), dims=model_dims(sess.model_path))
    seen, want = list(ids), []
    for _ in range(14):
        outs = dict(zip(names, sess.run(None, state.feeds())))
        logits = outs["logits"][0, -1].astype(np.float64)
        for t in set(seen):
            logits[t] = logits[t] / 1.5 if logits[t] > 0 else logits[t] * 1.5
        token = int(np.argmax(logits))
        want.append(token)
        seen.append(token)
        # feed the penalised choice back, not DecodeState's own argmax
        state.advance(outs)
        state.tokens[-1] = token
        state.ids[:] = token
    got = gen.generate(ids, max_new_tokens=14, repetition_penalty=1.5, eos_token_ids=[])
    assert got.token_ids == want
    assert want != gen.generate(ids, max_new_tokens=14, eos_token_ids=[]).token_ids


# -- batches of prompts of different lengths ------------------------------------------------


def test_a_batch_of_different_lengths_gives_each_row_its_own_tokens(gen, folder):
    rows = gen.generate(PROMPTS + ["Hi"], max_new_tokens=10, eos_token_ids=[])
    assert len({len(r.prompt_ids) for r in rows}) > 2
    for prompt, r in zip(PROMPTS + ["Hi"], rows):
        alone = gen.generate(prompt, max_new_tokens=10, eos_token_ids=[])
        assert r.token_ids == alone.token_ids, prompt
        assert r.token_ids == genai_greedy(folder, r.prompt_ids, 10)
    # sampled rows draw one number each per step, so a row differs from its run alone,
    # but the batch is reproducible
    opts = dict(max_new_tokens=10, do_sample=True, temperature=1.0, seed=5)
    first = [r.token_ids for r in gen.generate(PROMPTS, **opts)]
    assert first == [r.token_ids for r in gen.generate(PROMPTS, **opts)]


def test_rows_end_on_their_own(gen):
    ids = [gen.encode(p) for p in PROMPTS]
    free = [gen.generate(i, max_new_tokens=8, eos_token_ids=[]).token_ids for i in ids]
    eos = free[1][3]  # row 1 ends at its 4th token (or sooner, where it appears earlier)
    rows = gen.generate(ids, max_new_tokens=8, eos_token_ids=[eos])
    for r, f in zip(rows, free):
        cut = f.index(eos) + 1 if eos in f else len(f)
        assert r.token_ids == f[:cut]
        assert r.finish_reason == ("eos" if eos in f else "length")


def test_ragged_rows_on_the_shared_buffer_path():
    """The device path's full-capacity masks, on host buffers (share_on_host)."""
    sess = onnxep.InferenceSession(str(GENAI / "qwen2_fp32" / "model.onnx"), providers=["cpu"])
    rng = np.random.default_rng(4)
    prompts = [rng.integers(3, 500, n) for n in (9, 4, 6)]
    batch = np.zeros((3, 9), np.int64)
    for b, p in enumerate(prompts):
        batch[b, : len(p)] = p
    dec = GreedyDecoder(sess, batch, 7, lengths=[9, 4, 6], share_on_host=True, capacity=20)
    assert dec.full_mask
    while not dec.done:
        dec.step()
    got = dec.finish().token_ids
    for row, p in zip(got, prompts):
        alone = onnxep.generate(sess, p, 7, progress=False)
        assert row.tolist() == alone.tokens


@pytest.mark.parametrize(
    "model, why",
    [
        (GENAI / "qwen3_5_fp32" / "model.onnx", "fixed-size state 'past.0.conv'"),
        (DATA / "hf_llama_kv.onnx", "is not addressed by each row's length"),
        (DATA / "llama_kv.onnx", "takes no attention_mask"),
    ],
)
def test_models_that_cannot_take_padding_are_refused(model, why):
    sess = onnxep.InferenceSession(str(model), providers=["cpu"])
    batch = np.ones((2, 5), np.int64)
    dims = {"kv_cache_dim": 32, "head_size": 32} if "qwen3_5" in str(model) else None
    with pytest.raises(InvalidArgument, match=r"prompts of different lengths cannot be batched"):
        try:
            GreedyDecoder(sess, batch, 3, lengths=[5, 3], dims=dims)
        except InvalidArgument as exc:
            assert why in str(exc)
            raise
    # equal lengths still run
    GreedyDecoder(sess, batch, 1, lengths=[5, 5], dims=dims).step()


# -- stop strings and streaming -------------------------------------------------------------


def test_stop_strings_end_the_text_before_them(gen):
    full = gen.generate(PROMPTS[1], max_new_tokens=24, eos_token_ids=[])
    stop = full.text[6:9]
    assert stop and full.text.index(stop) >= 1
    pieces = gen.stream(PROMPTS[1], max_new_tokens=24, eos_token_ids=[], stop=[stop, "zzz"])
    shown = list(pieces)
    r = pieces.result
    assert r.finish_reason == "stop" and r.stop_string == stop
    assert r.text == full.text[: full.text.index(stop)]
    assert "".join(shown) == r.text
    assert r.token_ids == full.token_ids[: len(r.token_ids)] and len(r.token_ids) < 24


def test_streamed_pieces_come_as_the_tokens_do(gen):
    pieces = gen.stream(PROMPTS[0], max_new_tokens=20)
    seen = []
    for piece in pieces:
        seen.append(piece)
        if len(seen) == 2:
            assert pieces.result is None  # still generating
    assert len(seen) > 2 and "".join(seen) == pieces.result.text
    steps = gen.steps(PROMPTS[:2], max_new_tokens=6)
    got = list(steps)
    assert len(got) == 6 and all(s.tokens.shape == (2,) for s in got)
    for b, r in enumerate(steps.results):
        assert [int(s.tokens[b]) for s in got] == r.token_ids
        assert "".join(s.pieces[b] for s in got) == r.text


# -- onnxep.generate -----------------------------------------------------------------------


def test_onnxep_generate_takes_a_folder_or_a_session(folder, gen):
    r = onnxep.generate(folder, PROMPTS[0], max_new_tokens=8, providers=["cpu"])
    assert r.token_ids == gen.generate(PROMPTS[0], max_new_tokens=8).token_ids
    sess = onnxep.InferenceSession(str(folder / "model.onnx"), providers=["cpu"])
    rows = onnxep.generate(sess, PROMPTS[:2], max_new_tokens=8)
    assert [x.token_ids for x in rows] == [
        gen.generate(p, max_new_tokens=8).token_ids for p in PROMPTS[:2]
    ]
    # token ids on a session, no search options: the greedy decode's own result, as before
    ids = gen.encode(PROMPTS[0])
    old = onnxep.generate(sess, ids, 8, progress=False)
    assert isinstance(old, onnxep.GenerateResult) and old.tokens == r.token_ids
    sampled = onnxep.generate(sess, ids, 8, do_sample=True, seed=1, temperature=1.0)
    assert isinstance(sampled, onnxep.Generation) and sampled.text is not None


# -- what is refused ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"temperature": -1}, "temperature must be a number of 0 or more"),
        ({"temperature": float("nan")}, "temperature must be a number"),
        ({"top_p": 1.5}, r"top_p must be a number of 0 or more and at most 1"),
        ({"top_k": -2}, "top_k must be an integer of 0 or more"),
        ({"top_k": 2.5}, "top_k must be an integer"),
        ({"repetition_penalty": 0}, "repetition_penalty must be a number above 0"),
        ({"seed": -1}, "seed must be an integer of 0 or more"),
        ({"max_new_tokens": 0}, "max_new_tokens must be an integer of 1 or more"),
        ({"max_new_tokens": 300}, r"pass the model's context length \(256\).*<= 2\d\d"),
        ({"do_sample": "yes"}, "do_sample must be True or False"),
        ({"stop": ""}, "stop must be a non-empty string"),
        ({"eos_token_ids": ["x"]}, "eos_token_id must be an integer"),
        ({"top_k": 600, "do_sample": True}, "top_k 600 is more than the model's 512 tokens"),
        ({"beams": 2}, "unknown generation option 'beams'"),
        ({"system": "x"}, "system= is the chat's first message; give chat=True"),
    ],
)
def test_bad_options_are_named_and_leave_the_generator_usable(gen, kwargs, match):
    with pytest.raises(InvalidArgument, match=match):
        gen.generate(PROMPTS[0], **{"max_new_tokens": 4, **kwargs})
    assert len(gen.generate(PROMPTS[0], max_new_tokens=2).token_ids) == 2


def test_a_prompt_longer_than_the_context_is_refused(gen):
    with pytest.raises(InvalidArgument, match=r"the prompt is \d+ tokens.*context length \(256\)"):
        gen.generate("Once upon a time " * 80, max_new_tokens=4)


def test_bad_prompts_are_named(gen):
    for prompt, match in [
        ([], "a prompt is a string"),
        ([{"role": "user"}], "each a dict with a 'role' and a 'content'"),
        ([1.5, 2], "a prompt is a string"),
        ("", "makes no tokens"),
        ([5, 512], r"token id 512 is not in the model's vocabulary \(0 to 511\)"),
        ([[3], [-1, 4]], "token id -1 is not in the model's vocabulary"),
    ]:
        with pytest.raises(InvalidArgument, match=match):
            gen.generate(prompt, max_new_tokens=2)
    with pytest.raises(InvalidArgument, match="stream takes one prompt"):
        gen.stream(PROMPTS, max_new_tokens=2)


def test_a_folder_without_a_tokenizer_still_takes_token_ids(tmp_path):
    folder = make_text_folder(tmp_path / "m", tokenizer=False)
    gen = onnxep.Generator(folder, providers=["cpu"])
    with pytest.raises(InvalidArgument, match=r"has no tokenizer\.json, so text cannot become"):
        gen.generate("Hello", max_new_tokens=2)
    r = gen.generate([5, 6, 7], max_new_tokens=4)
    assert r.text is None and len(r.token_ids) == 4
    with pytest.raises(InvalidArgument, match="no tokenizer.json"):
        gen.generate([5, 6, 7], max_new_tokens=4, stop="x")
    # the tokenizer can be given
    given = onnxep.Generator(folder, providers=["cpu"], tokenizer=train_tokenizer())
    assert given.generate("Hello", max_new_tokens=3).text is not None


def test_a_folder_without_a_chat_template_refuses_a_chat(tmp_path):
    folder = make_text_folder(tmp_path / "m", chat_template=None)
    gen = onnxep.Generator(folder, providers=["cpu"])
    with pytest.raises(InvalidArgument, match="has no chat template"):
        gen.generate(CHAT, max_new_tokens=2)
    # transformers' newer layout: chat_template.jinja beside tokenizer_config.json
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    again = onnxep.Generator(folder, providers=["cpu"])
    assert again.encode(CHAT) == onnxep.Generator(folder.parent / "m").encode(CHAT)
    assert again.tokenizer.decode(again.encode(CHAT), skip_special_tokens=False).endswith(
        "<|im_start|>assistant\n"
    )


def test_a_session_and_bad_models(tmp_path, folder):
    sess = onnxep.InferenceSession(str(folder / "model.onnx"), providers=["cpu"])
    with pytest.raises(InvalidArgument, match="given a session already"):
        onnxep.Generator(sess, providers=["cpu"])
    with pytest.raises(InvalidArgument, match="model must be a model folder"):
        onnxep.Generator(42)
    with pytest.raises(InvalidArgument, match="does not exist"):
        onnxep.Generator(tmp_path / "nope")
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.onnx", "b.onnx"):
        shutil.copy(GENAI / "qwen2_fp32" / "model.onnx", two / name)
    with pytest.raises(InvalidArgument, match="no genai_config.json and 2 .onnx files"):
        onnxep.Generator(two)
    # a folder with only the model and the tokenizer needs max_new_tokens
    bare = tmp_path / "bare"
    shutil.copytree(folder, bare)
    (bare / "genai_config.json").unlink()
    gen = onnxep.Generator(bare, providers=["cpu"], dims={"kv_cache_dim": 64})
    with pytest.raises(InvalidArgument, match="give max_new_tokens"):
        gen.generate("Hi")
    r = gen.generate("Hi", max_new_tokens=3)
    assert len(r.token_ids) <= 3  # the tokenizer's end token (<|im_end|>) may end it
    assert gen.options().eos_token_ids == (EOS_IDS[0],)


def test_the_bench_script_reports_every_side(capsys):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ from the repo root
    from bench.text_generation import main

    assert main(["--size", "tiny", "--tokens", "4", "--prompt", "8", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "tiny fp32 on cpu: 8-token prompt, 4 new tokens" in out
    for side in ("peer", "Generator greedy", "Generator sampled", "ragged"):
        assert side in out and "tok/s" in out


def test_search_settings_it_does_not_apply_are_named(tmp_path):
    folder = make_text_folder(tmp_path / "m", search={"num_beams": 4, "min_length": 3})
    with pytest.warns(UserWarning, match=r"asks for num_beams=4, min_length=3;.*not applied"):
        gen = onnxep.Generator(folder, providers=["cpu"])
    assert len(gen.generate("Hi", max_new_tokens=2).token_ids) <= 2
