"""``onnxep.Generator``: from a prompt string to text, on a model folder or a session.

A model folder as onnxruntime-genai's builder writes it gives the decoder,
``genai_config.json`` (the ids that end a sequence, the pad id, the context
length, and the ``search`` defaults: ``max_length``, ``do_sample``,
``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``,
``random_seed``) and the tokenizer (:mod:`onnxep.tokenizer`). A prompt is
text, a chat (a list of ``{"role", "content"}`` messages, put through the
folder's chat template), or token ids; a list of them is a batch, padded on
the right with each row's length in the attention mask (see
``onnxep.generate._right_padding`` for the models that can take it).

Each step is one run of :class:`onnxep.generate.GreedyDecoder` (the KV cache
kept where the model runs); the next tokens are chosen on the device
(:mod:`onnxep.sampling`), and one host read per step brings back the ids. A
row ends at an end-of-sequence id (kept as its last token), at a stop string
(the text ends before it), or after ``max_new_tokens``; the batch ends when
every row has.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InvalidArgument
from .greedy import GenerateResult, GreedyDecoder
from .greedy import generate as generate_ids
from .model_folder import ModelFolder, read_folder
from .sampling import SearchOptions, TokenChooser, needs_chooser, search_options
from .text_stream import TextStream
from .tokenizer import TextTokenizer, load_tokenizer

EOS, STOP, LENGTH = "eos", "stop", "length"


@dataclass
class GenerationStats:
    """What one call cost. Times are wall clock from the call to the token on the host."""

    prompt_tokens: list[int]
    new_tokens: list[int]
    time_to_first_token_ms: float
    total_s: float
    #: runs after the first (one new token per row each) per second of their wall time
    decode_tokens_per_second: float
    device: str = ""
    state_path: str = ""
    #: wall ms of each step as the generation loop saw it: the run, the choice and the
    #: text, the prefill first (what the caller did between steps left out)
    step_ms: list[float] = field(default_factory=list)
    #: the decoder's own record: per-run timings, transfer counts, capture counters
    run: GenerateResult | None = field(default=None, repr=False)

    def summary(self) -> str:
        prompt = "/".join(map(str, sorted(set(self.prompt_tokens))))
        new = sum(self.new_tokens)
        rate = (
            f"{self.decode_tokens_per_second:.1f} tokens/s"
            if np.isfinite(self.decode_tokens_per_second)
            else "one step, no decode rate"
        )
        rows = f" over {len(self.new_tokens)} rows" if len(self.new_tokens) > 1 else ""
        return (
            f"prompt {prompt} tokens, {new} new tokens{rows} in {self.total_s:.2f} s; "
            f"first token {self.time_to_first_token_ms:.1f} ms, {rate} on {self.device}"
        )


@dataclass
class Generation:
    """One prompt's result."""

    #: the new text (None where there is no tokenizer): special tokens left out, ending
    #: before the stop string when one ended it
    text: str | None
    #: the new token ids, the end-of-sequence id included when one ended the row
    token_ids: list[int]
    prompt_ids: list[int]
    finish_reason: str  # "eos", "stop" or "length"
    stats: GenerationStats
    #: the stop string that ended it (finish_reason "stop")
    stop_string: str | None = None


@dataclass
class Step:
    """One step of a batch: each row's new token (-1 once the row has ended), the text it
    may show now, and why it ended (None while it goes on)."""

    tokens: np.ndarray
    pieces: list[str]
    finished: list[str | None]


class Steps:
    """The steps of one generation, to iterate; ``results`` once the last has come."""

    def __init__(self) -> None:
        self.results: list[Generation] | None = None
        self._it: Iterator[Step] = iter(())

    def attach(self, steps: Iterator[Step]) -> Steps:
        """Take the steps to hand out (the generator that fills ``results`` as it ends)."""
        self._it = steps
        return self

    def __iter__(self) -> Steps:
        return self

    def __next__(self) -> Step:
        return next(self._it)


class TextPieces:
    """One prompt's new text as it comes, to iterate; ``result`` once it has all come."""

    def __init__(self, steps: Steps) -> None:
        self._steps = steps
        self.result: Generation | None = None

    def __iter__(self) -> Iterator[str]:
        for step in self._steps:
            if step.pieces[0]:
                yield step.pieces[0]
        self.result = self._steps.results[0] if self._steps.results else None


def _is_chat(p: Any) -> bool:
    return (
        isinstance(p, Sequence)
        and not isinstance(p, str)
        and bool(p)
        and all(isinstance(m, Mapping) for m in p)
    )


def _is_ids(p: Any) -> bool:
    if isinstance(p, np.ndarray):
        return p.ndim == 1 and p.dtype.kind in "iu"
    return (
        isinstance(p, Sequence)
        and not isinstance(p, str)
        and bool(p)
        and all(isinstance(t, int | np.integer) and not isinstance(t, bool) for t in p)
    )


def _split(prompt: Any) -> tuple[list[Any], bool]:
    """The batch's prompts, and whether one prompt (not a list of them) was given."""
    if isinstance(prompt, str) or _is_chat(prompt) or _is_ids(prompt):
        return [prompt], True
    if isinstance(prompt, np.ndarray) and prompt.ndim == 2 and prompt.dtype.kind in "iu":
        return list(prompt), False
    if isinstance(prompt, Sequence) and prompt:
        rows = list(prompt)
        bad = [r for r in rows if not (isinstance(r, str) or _is_chat(r) or _is_ids(r))]
        if not bad:
            return rows, False
    raise InvalidArgument(
        "a prompt is a string, a chat (a list of {'role', 'content'} dicts) or token ids, "
        f"and a batch a non-empty list of them; got {prompt!r:.80}"
    )


class Generator:
    """Text generation with one model.

    ``model`` is a model folder (or the .onnx file in one) or an
    :class:`onnxep.InferenceSession` (its model's folder gives the config and
    tokenizer, where it has them). ``providers``, ``sess_options`` and
    ``provider_options`` make the session from a folder. ``tokenizer`` replaces
    the folder's (a ``tokenizers.Tokenizer`` or a transformers tokenizer).
    ``capacity`` and ``dims`` are :class:`GreedyDecoder`'s.
    """

    def __init__(
        self,
        model: Any,
        *,
        providers: Sequence[Any] | None = None,
        sess_options: Any = None,
        provider_options: Sequence[dict[str, Any]] | None = None,
        tokenizer: Any = None,
        capacity: int | None = None,
        dims: Mapping[str, int] | None = None,
    ) -> None:
        from ..session import InferenceSession

        if isinstance(model, str | Path):
            self.folder = read_folder(model)
            self.session = InferenceSession(
                str(self.folder.model), sess_options, providers, provider_options
            )
        elif hasattr(model, "io_binding") and hasattr(model, "get_inputs"):
            if (providers, sess_options, provider_options) != (None, None, None):
                raise InvalidArgument(
                    "providers, sess_options and provider_options make a session from a "
                    "model folder; this Generator was given a session already"
                )
            self.session = model
            path = model.model_path
            self.folder = read_folder(path) if path else ModelFolder(None, None)
        else:
            raise InvalidArgument(
                "model must be a model folder, an .onnx file in one, or an InferenceSession; "
                f"got {type(model).__name__}"
            )
        if self.folder.unsupported:
            warnings.warn(
                f"{self.folder.folder}/genai_config.json's search section asks for "
                f"{', '.join(self.folder.unsupported)}; onnxep generates one sequence per "
                "prompt, greedy or sampled, with no minimum length or n-gram blocking, so "
                "those settings are not applied",
                stacklevel=2,
            )
        self._tokenizer = TextTokenizer.wrap(tokenizer) if tokenizer is not None else None
        self.capacity, self.dims = capacity, dims
        outputs = self.session.get_outputs()
        logits = next((o for o in outputs if o.name == "logits"), outputs[0])
        last = logits.shape[-1] if logits.shape else None
        #: the logits' vocabulary where the model declares it (else the chooser reads it)
        self.vocab_size: int | None = last if isinstance(last, int) else None

    # -- the tokenizer ------------------------------------------------------------------
    @property
    def tokenizer(self) -> TextTokenizer:
        """The folder's tokenizer (read on first use) or the one given."""
        if self._tokenizer is None:
            if self.folder.folder is None:
                raise InvalidArgument(
                    "this session's model was not read from a file, so there is no folder "
                    "to find a tokenizer in; pass tokenizer= or give token ids"
                )
            self._tokenizer = load_tokenizer(self.folder.folder)
        return self._tokenizer

    def _has_tokenizer(self) -> bool:
        try:
            self.tokenizer  # noqa: B018 - loads it
        except InvalidArgument:
            return False
        return True

    def encode(
        self,
        prompt: Any,
        *,
        chat: bool | None = None,
        system: str | None = None,
        chat_kwargs: Mapping[str, Any] | None = None,
    ) -> list[int]:
        """One prompt's token ids. A chat (or a string, with ``chat=True``, as the user's
        message after ``system``'s) goes through the chat template, whose text is
        tokenized without adding special tokens again (the template has them)."""
        if _is_ids(prompt):
            if chat:
                raise InvalidArgument("chat=True needs text or messages, not token ids")
            ids = [int(t) for t in prompt]
            vocab = self.vocab_size or self.folder.vocab_size
            bad = [t for t in ids if t < 0 or (vocab is not None and t >= vocab)]
            if bad:
                raise InvalidArgument(
                    f"token id {bad[0]} is not in the model's vocabulary"
                    + (f" (0 to {vocab - 1})" if vocab else " (ids are 0 or more)")
                )
            return ids
        if isinstance(prompt, str) and not chat:
            if system is not None:
                raise InvalidArgument("system= is the chat's first message; give chat=True too")
            ids = self.tokenizer.encode(prompt)
        else:
            if chat is False:
                raise InvalidArgument("a list of messages is a chat; leave chat=False out")
            messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
            if system is not None:
                messages = [{"role": "system", "content": system}, *messages]
            text = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, **dict(chat_kwargs or {})
            )
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        if not ids:
            raise InvalidArgument(f"the prompt {prompt!r:.60} makes no tokens")
        return ids

    # -- options ------------------------------------------------------------------------
    def options(self, **given: Any) -> SearchOptions:
        """The search options for ``given``, genai_config.json's ``search`` section filling
        in what is not given, and its end-of-sequence ids (else the tokenizer's)."""
        defaults: dict[str, Any] = dict(self.folder.search)
        eos = self.folder.eos_token_ids
        if not eos and self._has_tokenizer() and self.tokenizer.eos_token_id is not None:
            eos = (self.tokenizer.eos_token_id,)
        defaults["eos_token_ids"] = eos
        return search_options(defaults, **given)

    def _new_tokens(self, opts: SearchOptions, longest: int) -> int:
        context = self.folder.context_length
        if longest >= (context or np.inf):
            raise InvalidArgument(
                f"the prompt is {longest} tokens, and the model's context length "
                f"({context}) leaves no room for a new one; shorten the prompt"
            )
        if opts.max_new_tokens is not None:
            if context and longest + opts.max_new_tokens > context:
                raise InvalidArgument(
                    f"a {longest}-token prompt and max_new_tokens {opts.max_new_tokens} pass "
                    f"the model's context length ({context}); give max_new_tokens <= "
                    f"{context - longest}"
                )
            return opts.max_new_tokens
        limit = self.folder.search.get("max_length") or context
        if not limit:
            raise InvalidArgument(
                "give max_new_tokens: there is no genai_config.json with a max_length or "
                "context_length to take it from"
            )
        if context:
            limit = min(limit, context)
        if limit <= longest:
            raise InvalidArgument(
                f"the prompt is {longest} tokens, as long as genai_config.json's max_length "
                f"({limit}); give max_new_tokens or shorten the prompt"
            )
        return limit - longest

    def _pad_id(self, opts: SearchOptions) -> int:
        if self.folder.pad_token_id is not None:
            return self.folder.pad_token_id
        if self._tokenizer is not None and self._tokenizer.pad_token_id is not None:
            return self._tokenizer.pad_token_id
        return opts.eos_token_ids[0] if opts.eos_token_ids else 0

    # -- generating ---------------------------------------------------------------------
    def steps(
        self,
        prompts: Any,
        *,
        chat: bool | None = None,
        system: str | None = None,
        chat_kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> Steps:
        """Generate for ``prompts`` one step at a time (see :meth:`generate` for the
        options). Everything is checked, and the prompts tokenized, before this returns."""
        t0 = time.perf_counter()
        rows, _ = _split(prompts)
        opts = self.options(**options)
        ids = [self.encode(p, chat=chat, system=system, chat_kwargs=chat_kwargs) for p in rows]
        # token-id prompts get text too where the folder has a tokenizer
        text = any(not _is_ids(p) for p in rows) or bool(opts.stop) or self._has_tokenizer()
        tokenizer = self.tokenizer if text else None
        lengths = np.array([len(r) for r in ids], np.int64)
        longest = int(lengths.max())
        steps = self._new_tokens(opts, longest)
        batch = np.full((len(ids), longest), self._pad_id(opts), np.int64)
        for b, r in enumerate(ids):
            batch[b, : len(r)] = r
        chooser = None
        if needs_chooser(opts):
            chooser = TokenChooser(opts, ids, self.vocab_size)
        decoder = GreedyDecoder(
            self.session,
            batch,
            steps,
            capacity=self.capacity,
            dims=self.dims,
            lengths=lengths,
            choose=chooser,
        )
        out = Steps()
        return out.attach(self._run(out, decoder, ids, lengths, opts, tokenizer, t0))

    def _run(
        self,
        out: Steps,
        decoder: GreedyDecoder,
        ids: list[list[int]],
        lengths: np.ndarray,
        opts: SearchOptions,
        tokenizer: TextTokenizer | None,
        t0: float,
    ) -> Iterator[Step]:
        streams = [TextStream(tokenizer, opts.stop) for _ in ids] if tokenizer else None
        eos = set(opts.eos_token_ids)
        new: list[list[int]] = [[] for _ in ids]
        finished: list[str | None] = [None] * len(ids)
        first = last = t0
        made = 0
        step_ms: list[float] = []
        while not decoder.done and None in finished:
            began = time.perf_counter()
            tokens = decoder.step()
            last = time.perf_counter()
            made += 1
            if made == 1:
                first = last
            chosen = np.full(len(ids), -1, np.int64)
            pieces = [""] * len(ids)
            ended: list[str | None] = [None] * len(ids)
            for b, t in enumerate(tokens.tolist()):
                if finished[b] is not None:
                    continue
                chosen[b] = t
                new[b].append(t)
                if streams is not None:
                    pieces[b] = streams[b].add(t)
                if t in eos:
                    ended[b] = EOS
                elif streams is not None and streams[b].stopped is not None:
                    ended[b] = STOP
                elif decoder.done:
                    ended[b] = LENGTH
                if ended[b] and streams is not None:
                    final = None if ended[b] == STOP else streams[b].tokenizer.decode(new[b])
                    pieces[b] += streams[b].finish(final)
                finished[b] = ended[b]
            step_ms.append((time.perf_counter() - began) * 1000.0)
            yield Step(chosen, pieces, ended)
        run = decoder.finish()
        decode_steps = made - 1
        stats = GenerationStats(
            prompt_tokens=lengths.tolist(),
            new_tokens=[len(r) for r in new],
            time_to_first_token_ms=(first - t0) * 1000.0,
            total_s=last - t0,
            decode_tokens_per_second=decode_steps / (last - first) if decode_steps else np.nan,
            device=run.device,
            state_path=run.state_path,
            step_ms=step_ms,
            run=run,
        )
        out.results = [
            Generation(
                text=streams[b].text if streams is not None else None,
                token_ids=new[b],
                prompt_ids=ids[b],
                finish_reason=finished[b] or LENGTH,
                stats=stats,
                stop_string=streams[b].stopped if streams is not None else None,
            )
            for b in range(len(ids))
        ]

    def generate(self, prompts: Any, **options: Any) -> Generation | list[Generation]:
        """The results for ``prompts``: one :class:`Generation` for one prompt, a list for a
        list of them. Options: ``max_new_tokens``, ``do_sample``, ``temperature``,
        ``top_k``, ``top_p``, ``repetition_penalty``, ``seed``, ``eos_token_ids``,
        ``stop`` (a string or a list), and ``chat``, ``system``, ``chat_kwargs`` (see
        :meth:`encode`); genai_config.json's ``search`` section gives the defaults."""
        _, single = _split(prompts)
        steps = self.steps(prompts, **options)
        for _ in steps:
            pass
        assert steps.results is not None
        return steps.results[0] if single else steps.results

    __call__ = generate

    def stream(self, prompt: Any, **options: Any) -> TextPieces:
        """One prompt's new text, piece by piece as the tokens come (see :meth:`generate`
        for the options); its ``result`` holds the :class:`Generation` afterwards."""
        _, single = _split(prompt)
        if not single:
            raise InvalidArgument("stream takes one prompt; for a batch, iterate steps()")
        return TextPieces(self.steps(prompt, **options))


_MAKING = ("providers", "sess_options", "provider_options", "tokenizer", "capacity", "dims")


def generate(model: Any, prompt: Any = None, max_new_tokens: int | None = None, **options: Any):
    """Generate from ``model`` (a model folder, or a session) for ``prompt``.

    Token ids on a session with no search options are the greedy decode of
    :func:`onnxep.generate.generate` (``input_ids``, ``capacity``, ``progress``
    and ``dims`` as there), returning its :class:`GenerateResult`. Anything
    else, text or chats above all, goes through :class:`Generator` and returns
    a :class:`Generation` (a list of them for a list of prompts).
    """
    if prompt is None:
        prompt = options.pop("input_ids", None)
    decode_only = {"capacity", "progress", "dims"}
    ids = (
        isinstance(prompt, np.ndarray)
        or _is_ids(prompt)
        or (
            isinstance(prompt, Sequence)
            and bool(prompt)
            and all(_is_ids(p) for p in prompt)
            and len({len(p) for p in prompt}) == 1
        )
    )
    if ids and not isinstance(model, str | Path) and set(options) <= decode_only:
        return generate_ids(model, prompt, max_new_tokens, **options)  # type: ignore[arg-type]
    making = {k: options.pop(k) for k in _MAKING if k in options}
    options.pop("progress", None)
    gen = Generator(model, **making)
    return gen.generate(prompt, max_new_tokens=max_new_tokens, **options)
