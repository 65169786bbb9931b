"""Greedy step-by-step decoding of a model with a KV cache (and other recurrent state).

Works on any model whose state inputs have matching outputs: an input named
``past_key_values.N.key`` (genai format) or ``past_*`` (torch exports) is
fed back from the output of the same name with ``present`` in place of
``past_key_values`` / ``past``. The state dim that grows is the symbolic dim
after the batch dim; inputs ``attention_mask`` and ``position_ids`` (2-D, or
3-D for multimodal rotary) are kept in step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InvalidArgument
from ..model_io import tensor_dtype


@dataclass
class StateInput:
    name: str
    output: str
    shape: list[Any]
    dtype: np.dtype
    grow_axis: int | None


@dataclass
class DecodeSpec:
    ids: str
    logits: str
    mask: str | None = None
    mask_dtype: np.dtype = np.dtype(np.int64)
    positions: str | None = None
    positions_rank: int = 2
    states: list[StateInput] = field(default_factory=list)
    vocab: int = 32


def present_name(name: str) -> str:
    if "past_key_values" in name:
        return name.replace("past_key_values", "present")
    return name.replace("past", "present", 1)


def decode_spec(inputs: Sequence[Any], outputs: Sequence[Any]) -> DecodeSpec:
    """Find ids, mask, positions, state pairs and logits among the model's inputs and outputs."""
    out_names = [o.name for o in outputs]
    by_name = {a.name: a for a in inputs}
    ids = next((n for n in by_name if n == "input_ids"), None) or inputs[0].name
    logits_arg = next((o for o in outputs if o.name == "logits"), outputs[0])
    vocab = (
        logits_arg.shape[-1] if logits_arg.shape and isinstance(logits_arg.shape[-1], int) else 32
    )
    spec = DecodeSpec(ids=ids, logits=logits_arg.name, vocab=vocab)
    for a in inputs:
        if a.name == ids:
            continue
        if a.name == "attention_mask":
            spec.mask, spec.mask_dtype = a.name, tensor_dtype(a.type)
        elif a.name == "position_ids":
            spec.positions, spec.positions_rank = a.name, len(a.shape or [0, 0])
        elif present_name(a.name) in out_names and a.name != present_name(a.name):
            grow = None
            for axis, d in enumerate(a.shape or []):
                if axis > 0 and not isinstance(d, int):
                    grow = axis
                    break
            spec.states.append(
                StateInput(
                    a.name, present_name(a.name), list(a.shape or []), tensor_dtype(a.type), grow
                )
            )
        else:
            raise InvalidArgument(
                f"decode mode does not know how to feed input {a.name!r}; expected input_ids, "
                "attention_mask, position_ids and past*/present* pairs"
            )
    return spec


def state_shape(
    s: StateInput, batch: int, rows: int, dims: dict[str, int] | None = None
) -> tuple[int, ...]:
    """The shape of state ``s`` for ``batch`` rows holding ``rows`` tokens along its grow axis."""
    shape = []
    for axis, d in enumerate(s.shape):
        if axis == 0:
            shape.append(batch)
        elif axis == s.grow_axis:
            shape.append(rows)
        elif isinstance(d, int):
            shape.append(d)
        elif dims and d in dims:
            shape.append(int(dims[d]))
        else:
            raise InvalidArgument(
                f"state input {s.name!r} has symbolic dim {d!r} at axis {axis} that the model "
                f"does not settle; give its value (--dim {d}=N, or dims={{{d!r}: N}}; a "
                "genai_config.json beside the model gives its head_size)"
            )
    return tuple(shape)


class DecodeState:
    """One side's tokens and cache during a decode."""

    def __init__(
        self,
        spec: DecodeSpec,
        context: int,
        batch: int = 1,
        seed: int = 0,
        prompt: np.ndarray | None = None,
        dims: dict[str, int] | None = None,
    ) -> None:
        self.spec = spec
        rng = np.random.default_rng(seed)
        self.batch = batch
        if prompt is not None:
            self.ids = np.asarray(prompt, np.int64).reshape(batch, -1)
        else:
            self.ids = rng.integers(0, min(spec.vocab, 1000), (batch, max(context, 1))).astype(
                np.int64
            )
        self.past = 0
        self.tokens: list[int] = []
        self.states: dict[str, Any] = {}
        for s in spec.states:
            self.states[s.name] = np.zeros(state_shape(s, batch, 0, dims), s.dtype)

    def feeds(self) -> dict[str, Any]:
        spec = self.spec
        n = self.ids.shape[1]
        f: dict[str, Any] = {spec.ids: self.ids}
        if spec.mask:
            f[spec.mask] = np.ones((self.batch, self.past + n), spec.mask_dtype)
        if spec.positions:
            pos = np.arange(self.past, self.past + n, dtype=np.int64)[None].repeat(self.batch, 0)
            f[spec.positions] = pos if spec.positions_rank == 2 else np.stack([pos] * 3)
        f.update(self.states)
        return f

    def advance(self, outputs: dict[str, Any]) -> int:
        logits = np.asarray(outputs[self.spec.logits])
        token = int(np.argmax(logits[0, -1]))
        self.tokens.append(token)
        self.past += self.ids.shape[1]
        self.ids = np.full((self.batch, 1), token, np.int64)
        for s in self.spec.states:
            self.states[s.name] = outputs[s.output]
        return token


def model_dims(model_path: str) -> dict[str, int]:
    """Symbolic dims a genai-format model's folder settles (genai_config.json's head size)."""
    import json
    from pathlib import Path

    cfg_path = Path(model_path).with_name("genai_config.json")
    if not cfg_path.is_file():
        return {}
    decoder = json.loads(cfg_path.read_text()).get("model", {}).get("decoder", {})
    head = decoder.get("head_size")
    return {"kv_cache_dim": int(head), "head_size": int(head)} if head else {}
