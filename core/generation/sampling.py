"""Choosing the next token: greedy or sampled, on the device that holds the logits.

The math runs with the provider's array module (NumPy on the CPU, CuPy on
CUDA), so a step reads back only the chosen ids. The order is transformers':
the repetition penalty over every token the row has seen (prompt and
generated: a positive logit is divided by it, a negative one multiplied),
then the temperature, top-k (the k highest logits, and any tied with the
k-th) and top-p (the fewest most likely tokens whose probabilities reach p).
The survivors are sampled by inverse CDF from one uniform number per row and
step, drawn on the host from ``numpy.random.default_rng(seed)``: the draws do
not depend on the device, and the tokens are ranked by a stable sort (ties in
index order), so the CPU and CUDA choose the same tokens for the same logits
and seed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import InvalidArgument


@dataclass(frozen=True)
class SearchOptions:
    """How to choose tokens, and when to stop. Build with :func:`search_options`."""

    max_new_tokens: int | None = None
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()

    @property
    def greedy(self) -> bool:
        """The most likely token every step (onnxruntime-genai's rule for greedy search)."""
        return not self.do_sample or self.temperature == 0 or self.top_k == 1


def _number(name: str, value: Any, lo: float, hi: float = math.inf, lo_open: bool = False) -> float:
    ok = isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)
    x = float(value) if ok else math.nan
    if not (math.isfinite(x) and (x > lo if lo_open else x >= lo) and x <= hi):
        bound = f"above {lo:g}" if lo_open else f"of {lo:g} or more"
        upper = f" and at most {hi:g}" if math.isfinite(hi) else ""
        raise InvalidArgument(f"{name} must be a number {bound}{upper}, got {value!r}")
    return x


def _integer(name: str, value: Any, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < lo:
        raise InvalidArgument(f"{name} must be an integer of {lo} or more, got {value!r}")
    return int(value)


def _stops(value: Any) -> tuple[str, ...]:
    stops = (value,) if isinstance(value, str) else tuple(value or ())
    if not all(isinstance(s, str) and s for s in stops):
        raise InvalidArgument(f"stop must be a non-empty string or a list of them, got {value!r}")
    return stops


def _eos(value: Any) -> tuple[int, ...]:
    values = [value] if isinstance(value, int | np.integer) else list(value)
    for v in values:
        _integer("eos_token_id", v, 0)
    return tuple(int(v) for v in values)


def search_options(defaults: Mapping[str, Any] | None = None, **given: Any) -> SearchOptions:
    """Options from ``given`` (None: not given), else ``defaults`` (genai_config.json's
    ``search`` section, with ``eos_token_ids``), else SearchOptions' own defaults.

    ``max_new_tokens`` stays None when neither gives it; the caller derives it
    from ``max_length`` and the prompt. A ``random_seed`` of -1 (genai's "seed from
    the system") is no seed.
    """
    d = dict(defaults or {})
    unknown = set(given) - {f for f in SearchOptions.__dataclass_fields__}
    if unknown:
        raise InvalidArgument(
            f"unknown generation option {sorted(unknown)[0]!r}; the options are "
            + ", ".join(SearchOptions.__dataclass_fields__)
        )

    def pick(name: str, default_key: str | None = None) -> Any:
        v = given.get(name)
        return v if v is not None else d.get(default_key or name)

    out: dict[str, Any] = {}
    if (v := pick("max_new_tokens")) is not None:
        out["max_new_tokens"] = _integer("max_new_tokens", v, 1)
    if (v := pick("do_sample")) is not None:
        if not isinstance(v, bool | np.bool_):
            raise InvalidArgument(f"do_sample must be True or False, got {v!r}")
        out["do_sample"] = bool(v)
    if (v := pick("temperature")) is not None:
        out["temperature"] = _number("temperature", v, 0.0)
    if (v := pick("top_k")) is not None:
        out["top_k"] = _integer("top_k", v, 0)
    if (v := pick("top_p")) is not None:
        out["top_p"] = _number("top_p", v, 0.0, 1.0)
    if (v := pick("repetition_penalty")) is not None:
        out["repetition_penalty"] = _number("repetition_penalty", v, 0.0, lo_open=True)
    seed = given.get("seed")
    if seed is None and d.get("random_seed", -1) != -1:
        seed = d["random_seed"]
    if seed is not None:
        out["seed"] = _integer("seed", seed, 0)
    if (v := pick("eos_token_ids")) is not None:
        out["eos_token_ids"] = _eos(v)
    if given.get("stop") is not None:
        out["stop"] = _stops(given["stop"])
    return SearchOptions(**out)


def needs_chooser(opts: SearchOptions) -> bool:
    """False when the decoder's own argmax gives the same tokens (plain greedy)."""
    return not opts.greedy or opts.repetition_penalty != 1.0


class TokenChooser:
    """``GreedyDecoder``'s ``choose``: one generation's next tokens under ``opts``.

    ``prompts`` are the rows' real prompt tokens (the repetition penalty's first
    seen tokens); ``vocab`` the logits' last dim (None: read from the first
    logits). Called once per step with the ``[batch, vocab]`` logits of each
    row's last real position and the array module that holds them; returns
    the chosen ids there.
    """

    def __init__(
        self, opts: SearchOptions, prompts: Sequence[Sequence[int]], vocab: int | None
    ) -> None:
        self.opts, self.vocab = opts, vocab
        if vocab is not None:
            self._check_vocab(vocab)
        self.batch = len(prompts)
        self._prompts = [np.asarray(p, np.int64) for p in prompts]
        self._rng = np.random.default_rng(opts.seed)
        self._seen: Any = None

    def _check_vocab(self, vocab: int) -> None:
        if not self.opts.greedy and self.opts.top_k > vocab:
            raise InvalidArgument(
                f"top_k {self.opts.top_k} is more than the model's {vocab} tokens; give "
                f"top_k <= {vocab}, or 0 for no top-k"
            )

    def uniforms(self) -> np.ndarray:
        """This step's draws, one per row in [0, 1)."""
        return self._rng.random(self.batch)

    def _first_seen(self, xp: Any) -> Any:
        seen = np.zeros((self.batch, self.vocab), bool)
        for row, ids in enumerate(self._prompts):
            seen[row, ids[(ids >= 0) & (ids < self.vocab)]] = True
        return xp.asarray(seen)

    def __call__(self, logits: Any, xp: Any) -> Any:
        o = self.opts
        x = logits.astype(xp.float32)
        if self.vocab is None and x.ndim == 2:
            self._check_vocab(x.shape[1])
            self.vocab = x.shape[1]
        if x.shape != (self.batch, self.vocab):
            raise InvalidArgument(
                f"logits of shape {list(x.shape)} for a batch of {self.batch} and a "
                f"{self.vocab}-token vocabulary"
            )
        if o.repetition_penalty != 1.0:
            if self._seen is None:
                self._seen = self._first_seen(xp)
            r = xp.float32(o.repetition_penalty)
            x = xp.where(self._seen, xp.where(x > 0, x / r, x * r), x)
        if o.greedy:
            ids = xp.argmax(x, axis=-1)
        else:
            ids = self._sample(x, xp)
        if self._seen is not None:
            self._seen[xp.arange(self.batch), ids] = True
        return ids

    def _sample(self, x: Any, xp: Any) -> Any:
        o = self.opts
        x = x / xp.float32(o.temperature)
        # descending, ties in index order on NumPy and CuPy alike (both sorts are stable)
        order = xp.argsort(-x, axis=-1, kind="stable") if xp is np else xp.argsort(-x, axis=-1)
        sx = xp.take_along_axis(x, order, axis=-1)
        keep = xp.ones(sx.shape, dtype=bool)
        if 0 < o.top_k < self.vocab:
            keep &= sx >= sx[:, o.top_k - 1 : o.top_k]
        probs = xp.exp((sx - sx[:, :1]).astype(xp.float64)) * keep
        if 0 < o.top_p < 1:
            cdf = xp.cumsum(probs, axis=-1)
            before = (cdf - probs) / cdf[:, -1:]
            keep &= before < o.top_p
            keep[:, 0] = True
            probs = probs * keep
        cdf = xp.cumsum(probs, axis=-1)
        target = xp.asarray(self.uniforms()) * cdf[:, -1]
        # the first rank whose cumulative probability passes the draw has a non-zero one
        rank = xp.sum(cdf <= target[:, None], axis=-1)
        rank = xp.minimum(rank, xp.sum(keep, axis=-1) - 1)
        return xp.take_along_axis(order, rank[:, None], axis=-1)[:, 0]
