"""OpenAI's completions and chat completions: requests read into Generator options, results
and streamed steps written back as OpenAI's objects.

Every field OpenAI defines is either applied or, when given a value that asks
for something onnxep does not do (``n`` above 1, ``logprobs``, penalties,
tools), refused in one sentence; an unknown field is refused as OpenAI
refuses it. Options not given take the model folder's ``genai_config.json``
``search`` defaults, as ``onnxep generate`` does, and sampling follows the
same rule as its command line: a temperature above 0, ``top_p`` or ``top_k``
samples, temperature 0 is greedy. ``top_k``, ``repetition_penalty`` and
``chat_template_kwargs`` are accepted as vLLM's server accepts them.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .limits import BAD_REQUEST, UNPROCESSABLE, Limits, RequestError, over_limit

#: fields of each route that are applied
_APPLIED = {
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "repetition_penalty",
    "user",
}
_COMPLETION_FIELDS = _APPLIED | {"prompt"}
_CHAT_FIELDS = _APPLIED | {"messages", "max_completion_tokens", "chat_template_kwargs"}
#: fields onnxep does not apply, each with the values that ask for nothing (accepted)
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "n": (1, None),
    "echo": (False, None),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "presence_penalty": (0, 0.0, None),
    "frequency_penalty": (0, 0.0, None),
    "best_of": (1, None),
    "logit_bias": (None, {}),
    "suffix": (None, ""),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "parallel_tool_calls": (None, True, False),
    "response_format": (None, {"type": "text"}),
}
_WHY = {
    "n": "one choice per prompt is made; send the request again for more",
    "best_of": "one choice per prompt is made",
    "echo": "the prompt is not repeated in the text",
    "logprobs": "log-probabilities are not computed",
    "top_logprobs": "log-probabilities are not computed",
    "presence_penalty": "give repetition_penalty instead",
    "frequency_penalty": "give repetition_penalty instead",
    "logit_bias": "logits are not biased",
    "suffix": "insertion is not done",
    "tools": "tool calling is not wired to the chat template",
    "tool_choice": "tool calling is not wired to the chat template",
    "response_format": "output is plain text",
}
_FINISH = {"eos": "stop", "stop": "stop", "length": "length"}


def _bad(message: str) -> RequestError:
    return RequestError(BAD_REQUEST, message)


@dataclass
class CompletionJob:
    """One completion request, checked: the prompts and the Generator's options."""

    chat: bool
    #: text, token ids, or (chat) a list of messages, one per choice
    prompts: list[Any]
    #: Generator.steps options (max_new_tokens, do_sample, temperature, top_p, top_k, seed,
    #: stop, repetition_penalty); absent ones take the folder's defaults
    options: dict[str, Any] = field(default_factory=dict)
    stream: bool = False
    include_usage: bool = False
    model: str | None = None
    chat_kwargs: dict[str, Any] | None = None
    id: str = ""
    created: int = 0


def _number(doc: Mapping[str, Any], name: str, low: float, high: float = math.inf) -> Any:
    v = doc.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not (low <= v <= high):
        top = "" if high == math.inf else f" and at most {high}"
        raise _bad(f"{name} must be a number of at least {low}{top}, got {v!r:.40}")
    return v


def _whole(doc: Mapping[str, Any], name: str, low: int) -> int | None:
    v = doc.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise _bad(f"{name} must be a whole number of at least {low}, got {v!r:.40}")
    return v


def _is_ids(p: Any) -> bool:
    return (
        isinstance(p, list)
        and bool(p)
        and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
    )


def _prompts(doc: Mapping[str, Any]) -> list[Any]:
    p = doc.get("prompt")
    if isinstance(p, str) or _is_ids(p):
        return [p]
    if isinstance(p, list) and p and all(isinstance(x, str) or _is_ids(x) for x in p):
        return list(p)
    raise _bad(
        "prompt must be a string, a list of strings, a list of token ids or a list of such "
        f"lists, got {str(p)[:60]!r}"
    )


def _content(m: Mapping[str, Any], i: int) -> str:
    c = m.get("content")
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        parts = []
        for part in c:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise _bad(f"messages[{i}] has a {kind!r} part; only text parts are read")
            if not isinstance(part.get("text"), str):
                raise _bad(f"messages[{i}]'s text part has no text string")
            parts.append(part["text"])
        return "".join(parts)
    if c is None and m.get("role") == "assistant":
        return ""
    raise _bad(f"messages[{i}].content must be a string or a list of text parts")


def _messages(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    msgs = doc.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _bad('messages must be a non-empty list of {"role": ..., "content": ...} objects')
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise _bad(f'messages[{i}] must be an object with a "role" string and "content"')
        msg = {"role": m["role"], "content": _content(m, i)}
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        out.append(msg)
    return out


def _stop(doc: Mapping[str, Any]) -> list[str] | None:
    s = doc.get("stop")
    if s is None:
        return None
    stops = [s] if isinstance(s, str) else s
    if not isinstance(stops, list) or not all(isinstance(x, str) and x for x in stops):
        raise _bad("stop must be a non-empty string or a list of them")
    if len(stops) > 16:
        raise RequestError(UNPROCESSABLE, f"stop lists {len(stops)} strings; give at most 16")
    return stops


def parse_request(doc: Any, limits: Limits, *, chat: bool) -> CompletionJob:
    """A /v1/completions (``chat`` False) or /v1/chat/completions body, checked."""
    route = "/v1/chat/completions" if chat else "/v1/completions"
    if not isinstance(doc, dict):
        raise _bad(f"the {route} body must be a JSON object")
    known = _CHAT_FIELDS if chat else _COMPLETION_FIELDS
    unknown = sorted(k for k in doc if k not in known and k not in _NEUTRAL)
    if unknown:
        raise _bad(f"unrecognized request argument(s) for {route}: {', '.join(unknown)}")
    for name, neutral in _NEUTRAL.items():
        if name in doc and doc[name] not in neutral:
            why = _WHY.get(name, "it is not applied")
            raise _bad(f"{name}={doc[name]!r:.40} is not supported by onnxep serve ({why})")
    model = doc.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model must be a string")
    prompts = [_messages(doc)] if chat else _prompts(doc)
    if len(prompts) > limits.max_rows:
        raise over_limit(UNPROCESSABLE, "the number of prompts", len(prompts), limits, "max_rows")
    max_tokens = _whole(doc, "max_tokens", 1)
    if chat and doc.get("max_completion_tokens") is not None:
        max_tokens = _whole(doc, "max_completion_tokens", 1)
    if max_tokens is not None and max_tokens > limits.max_tokens:
        raise over_limit(UNPROCESSABLE, "max_tokens", max_tokens, limits, "max_tokens")
    temperature = _number(doc, "temperature", 0.0)
    top_p = _number(doc, "top_p", 0.0, 1.0)
    if top_p == 0:
        raise _bad("top_p must be above 0 (1 keeps every token)")
    top_k = doc.get("top_k")
    if top_k == -1:  # vLLM's "all tokens"
        top_k = 0
    elif top_k is not None:
        top_k = _whole(doc, "top_k", 0)
    seed = doc.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise _bad(f"seed must be a whole number of 0 or more, got {seed!r:.40}")
    penalty = _number(doc, "repetition_penalty", 0.0)
    if penalty == 0:
        raise _bad("repetition_penalty must be above 0 (1 is no penalty)")
    stream = doc.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream must be true or false")
    opts = doc.get("stream_options")
    include_usage = False
    if opts is not None:
        if not stream:
            raise _bad("stream_options is only allowed with stream: true")
        if not isinstance(opts, dict) or set(opts) - {"include_usage"}:
            raise _bad('stream_options must be {"include_usage": true or false}')
        include_usage = bool(opts.get("include_usage", False))
    kwargs = doc.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise _bad("chat_template_kwargs must be an object")
    if temperature == 0:
        do_sample: bool | None = False
    elif (temperature or 0) > 0 or top_p is not None or top_k:
        do_sample = True
    else:
        do_sample = None
    options = {
        "max_new_tokens": max_tokens,
        "do_sample": do_sample,
        "temperature": temperature or None,
        "top_p": top_p,
        "top_k": top_k,
        "seed": seed,
        "stop": _stop(doc),
        "repetition_penalty": penalty,
    }
    prefix = "chatcmpl" if chat else "cmpl"
    return CompletionJob(
        chat=chat,
        prompts=prompts,
        options={k: v for k, v in options.items() if v is not None},
        stream=stream,
        include_usage=include_usage,
        model=model,
        chat_kwargs=kwargs,
        id=f"{prefix}-{uuid.uuid4().hex}",
        created=int(time.time()),
    )


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def response(job: CompletionJob, model: str, gens: Sequence[Any]) -> dict[str, Any]:
    """The whole (not streamed) response for the results ``gens``, one per prompt."""
    choices = []
    for i, g in enumerate(gens):
        choice: dict[str, Any] = {"index": i, "finish_reason": _FINISH[g.finish_reason]}
        if job.chat:
            choice["message"] = {"role": "assistant", "content": g.text}
        else:
            choice["text"] = g.text
        choice["logprobs"] = None
        choices.append(choice)
    return {
        "id": job.id,
        "object": "chat.completion" if job.chat else "text_completion",
        "created": job.created,
        "model": model,
        "choices": choices,
        "usage": usage(sum(len(g.prompt_ids) for g in gens), sum(len(g.token_ids) for g in gens)),
    }


class ChunkWriter:
    """OpenAI's stream chunks for a job, step by step."""

    def __init__(self, job: CompletionJob, model: str) -> None:
        self.job, self.model = job, model
        self._started: set[int] = set()

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        out = {
            "id": self.job.id,
            "object": "chat.completion.chunk" if self.job.chat else "text_completion",
            "created": self.job.created,
            "model": self.model,
            "choices": choices,
        }
        if self.job.include_usage:
            out["usage"] = None
        return out

    def _choice(self, index: int, text: str | None, finish: str | None) -> dict[str, Any]:
        if self.job.chat:
            delta: dict[str, Any] = {}
            if index not in self._started:
                delta["role"] = "assistant"
                self._started.add(index)
            if text is not None:
                delta["content"] = text
            return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}

    def step(self, pieces: Sequence[str], finished: Sequence[str | None]) -> list[dict[str, Any]]:
        """The chunks of one Generator step: each row's new text, then its end."""
        out = []
        for i, (piece, end) in enumerate(zip(pieces, finished)):
            if piece or (self.job.chat and i not in self._started):
                out.append(self._chunk([self._choice(i, piece, None)]))
            if end is not None:
                out.append(self._chunk([self._choice(i, None, _FINISH[end])]))
        return out

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        out = self._chunk([])
        out["usage"] = usage(prompt_tokens, completion_tokens)
        return out
