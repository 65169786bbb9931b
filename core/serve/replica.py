"""What one replica does: one InferenceSession (and, for a model folder with a
genai_config.json, one Generator on it), its /infer runs and its completions.

This is plain Python, with no Ray in it: the Ray Serve deployment
(:mod:`onnxep.serve.deployments`) holds one of these per replica and adds the
batching queue and the threads. Every answer to a client error is a
:class:`RequestError` value (returned or yielded, never raised across Ray), so
the ingress can tell a bad request from a replica that died.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import onnxep
from onnxep.errors import BoundsError, InvalidArgument, OnnxepError, RunError

from .batching import AUTO, BatchRunner, Request, find_batch_axis, rows
from .completions import ChunkWriter, CompletionJob, response
from .limits import (
    BAD_REQUEST,
    NOT_FOUND,
    UNPROCESSABLE,
    Limits,
    RequestError,
    over_limit,
)

logger = logging.getLogger("onnxep.serve")


def request_error(exc: BaseException) -> RequestError:
    """The HTTP answer to what a run or a generation raised: the session's own sentence."""
    if isinstance(exc, RequestError):
        return exc
    if isinstance(exc, InvalidArgument):
        return RequestError(BAD_REQUEST, str(exc))
    if isinstance(exc, BoundsError | RunError):
        # the model loaded and has run; a run that fails on these inputs is the inputs' doing
        return RequestError(UNPROCESSABLE, str(exc))
    if isinstance(exc, OnnxepError):
        return RequestError(500, str(exc), "server_error")
    if isinstance(exc, MemoryError):
        return RequestError(500, f"the replica ran out of memory ({exc})", "server_error")
    return RequestError(500, f"{type(exc).__name__}: {exc}", "server_error")


class ModelReplica:
    """One model, ready to serve.

    ``model`` is an .onnx file or a model folder; ``providers``, ``provider_options`` and
    ``sess_options`` are :class:`onnxep.InferenceSession`'s. A folder (or the folder of the
    file) with a ``genai_config.json`` also serves completions through
    :class:`onnxep.Generator`. ``batch_axis`` is :func:`find_batch_axis`'s.
    """

    def __init__(
        self,
        model: str | os.PathLike,
        *,
        providers: Sequence[Any] | None = None,
        provider_options: Sequence[dict[str, Any]] | None = None,
        sess_options: Any = None,
        batch_axis: int | str | None = AUTO,
        limits: Limits | None = None,
        name: str | None = None,
    ) -> None:
        path = Path(model)
        folder = path if path.is_dir() else path.parent
        self.text = (folder / "genai_config.json").is_file()
        self.generator: onnxep.Generator | None = None
        if path.is_dir():
            gen = onnxep.Generator(
                path,
                providers=providers,
                sess_options=sess_options,
                provider_options=provider_options,
            )
            self.session = gen.session
            self.generator = gen if self.text else None
        else:
            self.session = onnxep.InferenceSession(
                os.fspath(path), sess_options, providers, provider_options
            )
            if self.text:
                self.generator = onnxep.Generator(self.session)
        self.model = os.fspath(path)
        self.name = name or (path.name if path.is_dir() else path.stem)
        self.limits = limits or Limits()
        self.axis = find_batch_axis(self.session, batch_axis)
        self.runner = BatchRunner(self.session, self.axis)
        self._outputs = [a.name for a in self.session.get_outputs()]
        self._tokenizer_error: str | None = None
        if self.generator is not None:
            try:
                self.generator.tokenizer  # noqa: B018 - read now, not by the first request
            except InvalidArgument as exc:
                self._tokenizer_error = str(exc)  # token-id prompts still work
        self._lock = threading.Lock()
        self.started = time.time()
        self.completions = 0
        self.tokens = 0
        logger.info("%s", self.summary())

    # -- /infer -----------------------------------------------------------------------------
    def check(self, req: Request) -> RequestError | None:
        """The limit a request is over, before it joins a batch."""
        if self.axis.axis is not None:
            n = rows(req, self.axis.axis)
            if n is not None and n > self.limits.max_rows:
                return over_limit(
                    UNPROCESSABLE,
                    f"the request's rows along the batch axis ({self.axis.axis})",
                    n,
                    self.limits,
                    "max_rows",
                )
        return None

    def _answer(self, req: Request, result: Any) -> dict[str, Any] | RequestError:
        if isinstance(result, BaseException):
            return request_error(result)
        names = req.outputs or self._outputs
        return dict(zip(names, result))

    def infer(self, req: Request) -> dict[str, Any] | RequestError:
        """One request, run alone: its named outputs, or the error to answer with."""
        return self.check(req) or self._answer(req, self.runner.run_one(req))

    def infer_batch(self, reqs: Sequence[Request]) -> list[dict[str, Any] | RequestError]:
        """A batch of checked requests, run as :class:`BatchRunner` says."""
        return [self._answer(r, out) for r, out in zip(reqs, self.runner.run(reqs))]

    # -- completions ----------------------------------------------------------------------
    def _generator(self, job: CompletionJob) -> onnxep.Generator:
        if self.generator is None:
            raise RequestError(
                NOT_FOUND,
                f"{self.model} has no genai_config.json, so this server serves POST /infer only",
            )
        if job.model is not None and job.model != self.name:
            raise RequestError(
                NOT_FOUND,
                f"model {job.model!r} is not served here; this server serves {self.name!r}",
            )
        return self.generator

    def _default_new_tokens(self, gen: onnxep.Generator, longest: int) -> int | None:
        """max_tokens left out: the folder's max_length less the prompt, within the limit
        (None where there is no room: the Generator then says why)."""
        context = gen.folder.context_length
        limit = gen.folder.search.get("max_length") or context
        if not limit:
            return self.limits.max_tokens
        if context:
            limit = min(limit, context)
        room = limit - longest
        return min(room, self.limits.max_tokens) if room > 0 else None

    def start(self, job: CompletionJob) -> tuple[Any, list[list[int]]]:
        """The job's steps, made (prompts tokenized, every check done), and its prompt ids."""
        gen = self._generator(job)
        try:
            ids = [gen.encode(p, chat_kwargs=job.chat_kwargs) for p in job.prompts]
        except InvalidArgument as exc:
            raise request_error(exc) from None
        longest = max(len(r) for r in ids)
        if longest > self.limits.max_prompt_tokens:
            raise over_limit(
                UNPROCESSABLE,
                "the prompt's length in tokens",
                longest,
                self.limits,
                "max_prompt_tokens",
            )
        options = dict(job.options)
        if "max_new_tokens" not in options:
            options["max_new_tokens"] = self._default_new_tokens(gen, longest)
        try:
            return gen.steps(ids, **options), ids
        except InvalidArgument as exc:
            raise request_error(exc) from None

    def _count(self, steps: Any) -> None:
        with self._lock:
            self.completions += 1
            self.tokens += sum(len(g.token_ids) for g in steps.results or ())

    def complete(self, job: CompletionJob) -> dict[str, Any] | RequestError:
        """The whole response to a completion request, or the error to answer with."""
        try:
            steps, _ = self.start(job)
            for _ in steps:
                pass
        except Exception as exc:  # noqa: BLE001 - the request's answer
            return request_error(exc)
        self._count(steps)
        return response(job, self.name, steps.results)

    def stream(self, job: CompletionJob) -> Iterator[dict[str, Any] | RequestError]:
        """The response's chunks as the tokens come; an error is yielded, first or last."""
        try:
            steps, _ = self.start(job)
        except RequestError as exc:
            yield exc
            return
        writer = ChunkWriter(job, self.name)
        try:
            for step in steps:
                yield from writer.step(step.pieces, step.finished)
        except Exception as exc:  # noqa: BLE001 - ends the stream with an error event
            yield request_error(exc)
            return
        self._count(steps)
        if job.include_usage:
            res = steps.results
            yield writer.usage_chunk(
                sum(len(g.prompt_ids) for g in res), sum(len(g.token_ids) for g in res)
            )

    # -- the report -------------------------------------------------------------------------
    def summary(self) -> str:
        text = "; completions on" if self.generator is not None else ""
        return (
            f"onnxep.serve replica {os.getpid()}: {self.model} on "
            f"{', '.join(self.session.get_providers())}; batches {self.axis.reason}{text}"
        )

    def report(self) -> dict[str, Any]:
        """What this replica serves and how: providers, batching, limits, counters."""
        completions: dict[str, Any] = {"enabled": self.generator is not None}
        if self.generator is None:
            completions["why_not"] = f"{self.model} has no genai_config.json"
        else:
            completions.update(served=self.completions, tokens=self.tokens)
            if self._tokenizer_error:
                completions["tokenizer"] = self._tokenizer_error
        return {
            "model": self.model,
            "name": self.name,
            "pid": os.getpid(),
            "started": self.started,
            "providers": self.session.get_providers(),
            "inputs": [
                {"name": a.name, "type": a.type, "shape": a.shape}
                for a in self.session.get_inputs()
            ],
            "outputs": [
                {"name": a.name, "type": a.type, "shape": a.shape}
                for a in self.session.get_outputs()
            ],
            "batching": {
                "axis": self.axis.axis,
                "how": self.axis.reason,
                "runs": self.runner.runs,
                "requests": self.runner.requests,
                "largest_run": self.runner.largest,
            },
            "completions": completions,
            "limits": self.limits.as_dict(),
        }
