"""A model folder as onnxruntime-genai's model builder writes it, read for text generation.

The folder holds the decoder (``genai_config.json``'s ``model.decoder.filename``),
``genai_config.json`` (the token ids that end a sequence and pad a batch, the
context length, and the ``search`` section's defaults), and the tokenizer files
(:mod:`onnxep.tokenizer` reads those). A folder without a genai_config.json
still works when it holds exactly one ``.onnx`` file; then only what the
tokenizer's files say (its end token) is known.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InvalidArgument, InvalidModel

#: the ``search`` keys text generation reads, as onnxruntime-genai's config loader names them
SEARCH_KEYS = (
    "do_sample",
    "max_length",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "random_seed",
)


@dataclass
class ModelFolder:
    """What a model folder says about generating from its decoder."""

    folder: Path | None
    model: Path | None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    context_length: int | None = None
    vocab_size: int | None = None
    #: genai_config.json's ``search`` values among SEARCH_KEYS (absent keys left out)
    search: dict[str, Any] = field(default_factory=dict)
    has_config: bool = False
    #: ``search`` settings that ask for what text generation does not do (beam search,
    #: a minimum length, n-gram blocking), as "key=value"
    unsupported: list[str] = field(default_factory=list)


def _ids(value: Any, what: str, path: Path) -> tuple[int, ...]:
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise InvalidModel(f"{path}: {what} must be a token id or a list of them, got {value!r}")
    return tuple(values)


def _config(path: Path) -> dict[str, Any]:
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidModel(f"{path} cannot be read as JSON: {exc}") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model", {}), dict):
        raise InvalidModel(f"{path} is not a genai config: it has no 'model' object")
    return cfg


def read_folder(path: str | Path) -> ModelFolder:
    """The folder ``path`` is, or holds the model file ``path`` names."""
    p = Path(path)
    if not p.exists():
        raise InvalidArgument(f"model folder {str(p)!r} does not exist")
    folder = p if p.is_dir() else p.parent
    cfg_path = folder / "genai_config.json"
    if not cfg_path.is_file():
        if p.is_file():
            return ModelFolder(folder, p)
        models = sorted(folder.glob("*.onnx"))
        if len(models) != 1:
            raise InvalidArgument(
                f"{str(p)!r} has no genai_config.json and {len(models)} .onnx files; pass a "
                "model folder as onnxruntime-genai's builder writes it, or the .onnx file"
            )
        return ModelFolder(folder, models[0])
    return from_config(cfg_path, p if p.is_file() else None)


def from_config(cfg_path: Path, model: Path | None = None) -> ModelFolder:
    """The folder of ``cfg_path`` (a genai_config.json); ``model`` overrides the file it names."""
    cfg = _config(cfg_path)
    m = cfg.get("model", {})
    decoder = m.get("decoder", {}) if isinstance(m.get("decoder", {}), dict) else {}
    if model is None:
        name = decoder.get("filename", "model.onnx")
        model = cfg_path.parent / str(name)
        if not model.is_file():
            raise InvalidArgument(
                f"{cfg_path} names the decoder {str(name)!r}, which is not in the folder"
            )
    out = ModelFolder(cfg_path.parent, model, has_config=True)
    if "eos_token_id" in m:
        out.eos_token_ids = _ids(m["eos_token_id"], "model.eos_token_id", cfg_path)
    if "pad_token_id" in m:
        pads = _ids(m["pad_token_id"], "model.pad_token_id", cfg_path)
        out.pad_token_id = pads[0] if pads else None
    for key in ("context_length", "vocab_size"):
        v = m.get(key)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidModel(f"{cfg_path}: model.{key} must be a positive integer, got {v!r}")
            setattr(out, key, v)
    search = cfg.get("search", {})
    if isinstance(search, dict):
        out.search = {k: search[k] for k in SEARCH_KEYS if k in search}
        off = {"num_beams": 1, "num_return_sequences": 1, "min_length": 0}
        off["no_repeat_ngram_size"] = 0
        out.unsupported = [
            f"{k}={search[k]!r}" for k, v in off.items() if search.get(k, v) not in (v, None)
        ]
    return out
