"""The text side of generation: the folder's tokenizer, its chat template, streamed pieces."""

from __future__ import annotations

import json

import pytest
from text_models import CHAT_TEMPLATE, make_text_folder, train_tokenizer

from onnxep.errors import InvalidArgument, InvalidModel
from onnxep.generation.chat_template import pick_template, render_chat
from onnxep.generation.text_stream import TextStream
from onnxep.generation.tokenizer import TextTokenizer, load_tokenizer


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    return TextTokenizer.wrap(train_tokenizer())


# -- streamed pieces ------------------------------------------------------------------------


def pieces(tok, text, stop=()):
    s = TextStream(tok, stop)
    out = [s.add(t) for t in tok.encode(text)]
    return out, s


def test_pieces_add_up_to_the_whole_decode(tok):
    text = "Héllo, 日本語 world! naïve café"
    out, s = pieces(tok, text)
    assert "".join(out) + s.finish(tok.decode(tok.encode(text))) == text
    # a character split over byte tokens comes out whole, never as a replacement mark
    assert all("\ufffd" not in p for p in out)
    assert any(p == "" for p in out)  # held back while a character was incomplete


def test_a_stop_string_ends_the_text_and_its_start_is_held_back(tok):
    text = "the clock stopped. Nobody knew how to fix it."
    out, s = pieces(tok, text, stop=["Nobody"])
    assert s.stopped == "Nobody"
    assert "".join(out) == s.text == "the clock stopped. "
    assert s.add(5) == "" and s.finish() == ""
    # a held-back start that does not become the stop string is given out after all
    out, s = pieces(tok, "No no Nobo", stop=["Nobody"])
    assert "".join(out) == "No no " and s.stopped is None
    assert s.finish(tok.decode(tok.encode("No no Nobo"))) == "Nobo"


def test_the_first_stop_string_in_the_text_wins(tok):
    out, s = pieces(tok, "a cup of tea and a lamp", stop=["lamp", "tea"])
    assert s.stopped == "tea" and s.text == "a cup of "


# -- the tokenizer --------------------------------------------------------------------------


def test_the_folder_tokenizer_reads_special_tokens_and_the_template(tmp_path):
    folder = make_text_folder(tmp_path / "m")
    t = load_tokenizer(folder)
    assert t.kind == "tokenizers" and t.chat_template == CHAT_TEMPLATE
    assert t.special_tokens["eos_token"] == "<|im_end|>" and t.eos_token_id == 2
    assert t.pad_token_id == 0 and t.special_tokens["bos_token"] is None
    # special tokens in text are the special ids; decoding leaves them out unless asked
    ids = t.encode("<|im_start|>user")
    assert ids[0] == 1
    assert t.decode(ids) == "user" and t.decode(ids, skip_special_tokens=False).startswith("<|")
    # tokenizer_config.json may write them as AddedToken objects
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["eos_token"] = {"__type": "AddedToken", "content": "<|endoftext|>", "special": True}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert load_tokenizer(folder).eos_token_id == 0


def test_clean_up_tokenization_spaces_as_transformers(tmp_path):
    folder = make_text_folder(tmp_path / "m")
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["clean_up_tokenization_spaces"] = True
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    t = load_tokenizer(folder)
    assert t.decode(t.encode("Ada , she said . Is it ? It 's fine !")) == (
        "Ada, she said. Is it? It's fine!"
    )


def test_broken_tokenizer_files_are_named(tmp_path):
    folder = make_text_folder(tmp_path / "m")
    (folder / "tokenizer.json").write_text("{not json")
    with pytest.raises(InvalidModel, match="tokenizer.json is not a tokenizer tokenizers can read"):
        load_tokenizer(folder)
    (folder / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(InvalidModel, match="holds list, not a JSON object"):
        load_tokenizer(folder)
    (folder / "tokenizer_config.json").unlink()
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.model").write_bytes(b"\0")
    try:
        import transformers  # noqa: F401
    except ImportError:
        with pytest.raises(InvalidArgument, match="only tokenizer.model, which needs transformers"):
            load_tokenizer(folder)
    else:
        with pytest.raises(InvalidModel, match="transformers cannot read the tokenizer"):
            load_tokenizer(folder)


def test_a_transformers_tokenizer_is_used_where_the_folder_needs_it(tmp_path):
    transformers = pytest.importorskip("transformers")
    folder = make_text_folder(tmp_path / "m")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    fast.save_pretrained(str(tmp_path / "hf"))
    slow_dir = tmp_path / "slow"
    slow_dir.mkdir()
    # GPT-2's slow files (vocab.json, merges.txt) and no tokenizer.json
    transformers.GPT2Tokenizer(*fast.backend_tokenizer.model.save(str(slow_dir))).save_pretrained(
        str(slow_dir)
    )
    (slow_dir / "tokenizer.json").unlink(missing_ok=True)
    t = load_tokenizer(slow_dir)
    assert t.kind == "transformers"
    text = "Once upon a time"
    assert t.decode(t.encode(text)) == text
    # and the chat template renders as transformers' own apply_chat_template
    fast.chat_template = CHAT_TEMPLATE
    fast.eos_token = "<|im_end|>"
    ours = TextTokenizer.wrap(fast)
    for msgs in (
        [{"role": "user", "content": "Hi"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    ):
        for gen in (True, False):
            theirs = fast.apply_chat_template(msgs, tokenize=False, add_generation_prompt=gen)
            assert ours.apply_chat_template(msgs, add_generation_prompt=gen) == theirs


# -- the chat template ----------------------------------------------------------------------


def test_templates_render_as_transformers_does():
    tpl = (
        "{% for m in messages %}{% if m.role == 'system' %}[S]{{ m.content | trim }}\n"
        "{% else %}[{{ m.role | upper }}] {{ m.content }}\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}[ASSISTANT]{% endif %}{{ bos_token }}"
        "{{ {'k': 'ü'} | tojson }}{{ tools is none }}"
    )
    msgs = [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "Hi"}]
    out = render_chat(tpl, msgs, special_tokens={"bos_token": "<s>"})
    assert out == '[S]Be brief.\n[USER] Hi\n[ASSISTANT]<s>{"k": "ü"}True'
    assert render_chat(tpl, msgs, add_generation_prompt=False).startswith("[S]")
    # loop controls and the generation block are there as in transformers
    tpl = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}{{ flag }}"
    )
    assert render_chat(tpl, msgs, flag="!") == "  Be brief.  !"


def test_templates_cannot_reach_python_or_change_the_messages():
    msgs = [{"role": "user", "content": "Hi"}]
    for tpl in (
        "{{ messages.__class__.__mro__ }}",
        "{{ messages.append(1) }}",
        "{{ ''.__class__.__subclasses__() }}",
    ):
        with pytest.raises(InvalidArgument, match="the chat template refused the messages"):
            render_chat(tpl, msgs)
    with pytest.raises(InvalidArgument, match="refused the messages: no tools here"):
        render_chat("{{ raise_exception('no tools here') }}", msgs)
    with pytest.raises(InvalidModel, match=r"does not parse \(line 1"):
        render_chat("{% for %}", msgs)


def test_template_lists_pick_the_default():
    listed = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    assert pick_template(listed, "x") == "D"
    assert pick_template([{"name": "only", "template": "O"}], "x") == "O"
    assert pick_template(None, "x") is None and pick_template("", "x") is None
    with pytest.raises(InvalidModel, match="with a 'default' one"):
        pick_template([{"name": "a", "template": "A"}, {"name": "b", "template": "B"}], "x")
