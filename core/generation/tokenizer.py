"""A model folder's tokenizer: text to token ids and back, and its chat template.

``tokenizer.json`` (what the model builder copies into the folder) is read with
Hugging Face's ``tokenizers`` library (``pip install 'onnxep[text]'``). A
folder without one (a slow tokenizer's ``tokenizer.model`` or ``vocab.json``)
is read with transformers' ``AutoTokenizer`` when transformers is installed.
``tokenizer_config.json`` gives the special tokens, the chat template, and
whether decoding cleans up spaces before punctuation, as transformers does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import InvalidArgument, InvalidModel
from . import chat_template

SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token")

#: transformers' clean_up_tokenization: a space dropped before these
_CLEAN_UPS = (" .", " ?", " !", " ,", " ' ", " n't", " 'm", " 's", " 've", " 're")


def _content(token: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(token, Mapping):
        token = token.get("content")
    return token if isinstance(token, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidModel(f"{path} cannot be read as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidModel(f"{path} holds {type(data).__name__}, not a JSON object")
    return data


class TextTokenizer:
    """Encode, decode and chat-format for one model. Build with :func:`load_tokenizer`
    or :meth:`wrap`."""

    def __init__(
        self,
        backend: Any,
        kind: str,
        config: Mapping[str, Any] | None = None,
        template: str | None = None,
        where: str = "the tokenizer",
    ) -> None:
        self.backend, self.kind, self.where = backend, kind, where
        self.config = dict(config or {})
        self.chat_template = template
        self.special_tokens = {k: _content(self.config.get(k)) for k in SPECIAL}
        self.clean_up_spaces = bool(self.config.get("clean_up_tokenization_spaces", False))

    @classmethod
    def wrap(cls, tokenizer: Any) -> TextTokenizer:
        """A ``TextTokenizer``, a ``tokenizers.Tokenizer`` or a transformers tokenizer."""
        if isinstance(tokenizer, TextTokenizer):
            return tokenizer
        if hasattr(tokenizer, "encode_batch") and hasattr(tokenizer, "token_to_id"):
            return cls(tokenizer, "tokenizers", where="the given tokenizer")
        if hasattr(tokenizer, "convert_tokens_to_ids") and hasattr(tokenizer, "decode"):
            cfg = {k: getattr(tokenizer, k, None) for k in SPECIAL}
            template = getattr(tokenizer, "chat_template", None)
            return cls(tokenizer, "transformers", cfg, template, "the given tokenizer")
        raise InvalidArgument(
            f"tokenizer must be a tokenizers.Tokenizer or a transformers tokenizer, got "
            f"{type(tokenizer).__name__}"
        )

    # -- text <-> ids ---------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self.kind == "tokenizers":
            return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        ids = [int(i) for i in ids]
        if self.kind == "transformers":
            return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)
        text = self.backend.decode(ids, skip_special_tokens=skip_special_tokens)
        if self.clean_up_spaces:
            for s in _CLEAN_UPS:
                text = text.replace(s, s[1:])
        return text

    def token_id(self, token: str | None) -> int | None:
        if token is None:
            return None
        if self.kind == "tokenizers":
            return self.backend.token_to_id(token)
        i = self.backend.convert_tokens_to_ids(token)
        return (
            i if isinstance(i, int) and i != getattr(self.backend, "unk_token_id", None) else None
        )

    @property
    def eos_token_id(self) -> int | None:
        return self.token_id(self.special_tokens["eos_token"])

    @property
    def pad_token_id(self) -> int | None:
        return self.token_id(self.special_tokens["pad_token"])

    # -- chat -----------------------------------------------------------------------------
    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **kw: Any
    ) -> str:
        """The prompt text of ``messages`` (see :mod:`onnxep.chat_template`)."""
        if not self.chat_template:
            raise InvalidArgument(
                f"{self.where} has no chat template (tokenizer_config.json's chat_template or "
                "chat_template.jinja); give the prompt as text in the form the model expects"
            )
        return chat_template.render_chat(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            special_tokens=self.special_tokens,
            **kw,
        )


def _template(folder: Path, config: Mapping[str, Any]) -> str | None:
    where = str(folder / "tokenizer_config.json")
    found = chat_template.pick_template(config.get("chat_template"), where)
    jinja_file = folder / "chat_template.jinja"
    if found is None and jinja_file.is_file():
        found = jinja_file.read_text(encoding="utf-8")
    return found


def load_tokenizer(folder: str | Path) -> TextTokenizer:
    """The tokenizer whose files are in ``folder``."""
    folder = Path(folder)
    cfg_path = folder / "tokenizer_config.json"
    config = _read_json(cfg_path) if cfg_path.is_file() else {}
    template = _template(folder, config)
    path = folder / "tokenizer.json"
    if path.is_file():
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise InvalidArgument(
                f"reading {path} needs Hugging Face's tokenizers library: pip install "
                "'onnxep[text]'"
            ) from None
        try:
            backend = Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust library raises its own Exception subclass
            raise InvalidModel(f"{path} is not a tokenizer tokenizers can read: {exc}") from None
        return TextTokenizer(backend, "tokenizers", config, template, str(folder))
    slow = [f for f in ("tokenizer.model", "vocab.json", "spiece.model") if (folder / f).is_file()]
    if slow:
        try:
            from transformers import AutoTokenizer
        except ImportError:
            raise InvalidArgument(
                f"{folder} has no tokenizer.json, only {slow[0]}, which needs transformers' "
                "AutoTokenizer: pip install transformers (or save the tokenizer with "
                "save_pretrained, which writes tokenizer.json)"
            ) from None
        try:
            backend = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        except Exception as exc:  # transformers raises many kinds; the message says which
            raise InvalidModel(
                f"transformers cannot read the tokenizer in {folder}: {exc}"
            ) from None
        return TextTokenizer(backend, "transformers", config, template, str(folder))
    raise InvalidArgument(
        f"{folder} has no tokenizer.json, so text cannot become token ids; copy the "
        "tokenizer's files into it (the model builder does), pass tokenizer=, or give token ids"
    )
