"""Model folders with a tokenizer, made at test time, as onnxruntime-genai's builder lays them out.

The decoder is one of tests/data/genai's (a 512-token vocabulary); the
tokenizer a byte-level BPE that ``tokenizers`` trains on the fixed text
below to exactly 512 tokens, the first three the special tokens of a
Qwen-style chat (``<|endoftext|>`` 0, ``<|im_start|>`` 1, ``<|im_end|>`` 2).
tokenizer_config.json holds the special tokens and the chat template the way
transformers saves them; genai_config.json ends a sequence at ``<|im_end|>``
or ``<|endoftext|>`` and pads with ``<|endoftext|>``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

GENAI = Path(__file__).parent / "data" / "genai"

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS_IDS = [2, 0]

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

TEXT = """Once upon a time, in a small town by the sea, there lived an old clockmaker named Ada.
Every morning she opened her shop, wound the clocks, and listened to them tick together.
Children came by after school to watch her work; she showed them gears, springs and tiny screws.
"Time is patient," she told them, "but it never waits for anyone."
One winter the great clock in the town square stopped. Nobody knew how to fix it.
The mayor asked the carpenter, the baker and the fisherman, but none of them could help.
At last they came to Ada. She climbed the tower with her tools, a lamp and a cup of tea.
Inside, the gears were frozen with ice and rust. She cleaned each one, oiled the axles,
and replaced a broken spring with one she had made herself years ago.
When the bells rang again at noon, the whole town cheered, and the children danced in the snow.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs!
How vexingly quick daft zebras jump; the five boxing wizards jump quickly.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024. Punctuation: , . ; : ! ? ( ) [ ] { } - _ / \\ ' "
Questions and answers: What is your name? My name is Ada. Where do you live? By the sea.
"""


def train_tokenizer(vocab_size: int = 512) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT], trainer)
    assert tok.get_vocab_size() == vocab_size, tok.get_vocab_size()
    return tok


def tokenizer_config(chat_template: str | None = CHAT_TEMPLATE) -> dict[str, Any]:
    added = {
        str(i): {
            "content": s,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, s in enumerate(SPECIALS)
    }
    cfg: dict[str, Any] = {
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 256,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    if chat_template is not None:
        cfg["chat_template"] = chat_template
    return cfg


def make_text_folder(
    dest: Path,
    source: str = "qwen2_fp32",
    *,
    tokenizer: bool = True,
    chat_template: str | None = CHAT_TEMPLATE,
    model: dict[str, Any] | None = None,
    search: dict[str, Any] | None = None,
) -> Path:
    """A copy of tests/data/genai/``source`` with the tokenizer's files, in ``dest``.
    ``model`` and ``search`` update genai_config.json's sections."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in (GENAI / source).iterdir():
        if f.name != "genai_config.json":
            shutil.copy(f, dest / f.name)
    cfg = json.loads((GENAI / source / "genai_config.json").read_text())
    cfg["model"].update(eos_token_id=EOS_IDS, pad_token_id=0, bos_token_id=0)
    cfg["model"].update(model or {})
    cfg["search"].update(search or {})
    (dest / "genai_config.json").write_text(json.dumps(cfg, indent=4))
    if tokenizer:
        train_tokenizer().save(str(dest / "tokenizer.json"))
        (dest / "tokenizer_config.json").write_text(
            json.dumps(tokenizer_config(chat_template), indent=2)
        )
    return dest
