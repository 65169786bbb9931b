"""The HTTP side of a deployment: routes, bodies read within the limits, answers, and
retries when the replica serving a request dies.

It holds no model: it parses and checks a request (a malformed or oversized
one is answered here and never reaches a model replica), calls the model
deployment through a Ray Serve handle, and writes the answer. A request whose
replica dies under it (``ray.kill``, a lost node) is sent again to another
replica, a few times within the request timeout: an /infer run has no side
effects, and a completion is retried only before its first piece has gone
out. One that still cannot be served gets a 503 that says so; one that waits
past the timeout a 504, so no request hangs.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from ray import exceptions as ray_errors
from ray.serve import exceptions as serve_errors
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from .batching import Request as InferRequest
from .completions import parse_request
from .limits import (
    NOT_ALLOWED,
    NOT_FOUND,
    TIMEOUT,
    TOO_LARGE,
    UNAVAILABLE,
    Limits,
    RequestError,
    over_limit,
)
from .tensors import (
    feeds_from_json,
    feeds_from_npz,
    is_npz,
    outputs_to_json,
    outputs_to_npz,
    parse_json,
)

#: what a call through a handle raises when the replica it went to is gone or refusing
REPLICA_GONE = (
    ray_errors.RayActorError,  # ActorDiedError, ActorUnavailableError
    serve_errors.ReplicaUnavailableError,
    serve_errors.DeploymentUnavailableError,
    serve_errors.BackPressureError,
)
#: attempts at one request (the first and the retries), and the pause before each retry
ATTEMPTS = 4
BACKOFF_S = 0.25
logger = logging.getLogger("onnxep.serve")

ROUTES = {
    "/infer": ("POST",),
    "/v1/completions": ("POST",),
    "/v1/chat/completions": ("POST",),
    "/v1/models": ("GET",),
    "/health": ("GET",),
    "/report": ("GET",),
}
JSON = "application/json"
NPZ = "application/x-npz"


def json_response(body: Any, status: int = 200) -> Response:
    return Response(json.dumps(body, allow_nan=False), status_code=status, media_type=JSON)


def error_response(err: RequestError) -> Response:
    return json_response(err.body(), err.status)


def _path(request: Request) -> str:
    path = request.url.path
    root = request.scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path.rstrip("/") or "/"


async def read_body(request: Request, limits: Limits) -> bytes:
    """The body, refused with 413 as soon as it passes ``max_body_bytes``."""
    limit = limits.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise over_limit(TOO_LARGE, "the request body", int(declared), limits, "max_body_bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise over_limit(TOO_LARGE, "the request body", size, limits, "max_body_bytes")
        chunks.append(chunk)
    body = b"".join(chunks)
    if not body:
        raise RequestError(400, "the request body is empty")
    return body


def _wants_npz(request: Request, sent_npz: bool) -> bool:
    accept = request.headers.get("accept", "")
    if NPZ in accept or "application/octet-stream" in accept:
        return True
    if JSON in accept:
        return False
    return sent_npz


class Ingress:
    """Routes HTTP requests to a model deployment's handle (see the module's doc)."""

    def __init__(self, model: Any, limits: Limits, name: str) -> None:
        self.model = model
        self.limits = limits
        self.name = name
        #: calls sent again because the replica they went to was gone
        self.retried = 0

    async def _call(self, method: str, *args: Any) -> Any:
        """``method`` on a model replica, again on another when the replica is gone, within
        ``request_timeout_s`` in all."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.request_timeout_s
        for attempt in range(ATTEMPTS):
            response = getattr(self.model, method).remote(*args)
            try:
                return await asyncio.wait_for(_awaited(response), deadline - loop.time())
            except TimeoutError:
                response.cancel()
                raise self._timeout() from None
            except REPLICA_GONE as exc:
                last = exc
                self.retried += 1
                logger.warning("%s: the replica is gone (%s); sent again", method, _name(exc))
            if attempt + 1 < ATTEMPTS and loop.time() + BACKOFF_S < deadline:
                await asyncio.sleep(BACKOFF_S * (attempt + 1))
            else:
                break
        raise RequestError(
            UNAVAILABLE,
            f"no model replica could serve this request: the replica it was sent to "
            f"{attempt + 1} time(s) was gone ({type(last).__name__}); try again shortly",
            "server_error",
        )

    def _timeout(self) -> RequestError:
        return RequestError(
            TIMEOUT,
            f"no model replica answered within {self.limits.request_timeout_s:g} s "
            "(request_timeout_s; onnxep serve --request-timeout-s)",
            "server_error",
        )

    async def __call__(self, request: Request) -> Response:
        try:
            return await self._route(request)
        except RequestError as err:
            return error_response(err)

    async def _route(self, request: Request) -> Response:
        path = _path(request)
        methods = ROUTES.get(path)
        if methods is None:
            raise RequestError(
                NOT_FOUND, f"no route {path!r}; this server has {', '.join(sorted(ROUTES))}"
            )
        if request.method not in methods:
            raise RequestError(
                NOT_ALLOWED, f"{path} takes {' or '.join(methods)}, not {request.method}"
            )
        if path == "/health":
            return json_response({"status": "ok"})
        if path == "/report":
            report = await self._call("report")
            report["ingress"] = {"retried": self.retried}
            return json_response(report)
        if path == "/v1/models":
            return json_response(
                {
                    "object": "list",
                    "data": [{"id": self.name, "object": "model", "owned_by": "onnxep"}],
                }
            )
        body = await read_body(request, self.limits)
        if path == "/infer":
            return await self._infer(request, body)
        chat = path == "/v1/chat/completions"
        job = parse_request(parse_json(body), self.limits, chat=chat)
        if job.stream:
            return await self._stream(job)
        answer = await self._call("complete", job)
        if isinstance(answer, RequestError):
            raise answer
        return json_response(answer)

    async def _infer(self, request: Request, body: bytes) -> Response:
        sent_npz = is_npz(request.headers.get("content-type"), body)
        if sent_npz:
            feeds = feeds_from_npz(body, self.limits)
            wanted = request.query_params.get("outputs")
            outputs = [n for n in wanted.split(",") if n] if wanted else None
        else:
            feeds, outputs = feeds_from_json(body)
        answer = await self._call("infer", InferRequest(feeds, outputs))
        if isinstance(answer, RequestError):
            raise answer
        if _wants_npz(request, sent_npz):
            return Response(outputs_to_npz(answer), media_type=NPZ)
        return Response(outputs_to_json(answer), media_type=JSON)

    async def _stream(self, job: Any) -> Response:
        """Server-sent events. The first chunk is awaited before the response starts, so a
        bad request is still a 4xx, and a replica gone before it is retried."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.request_timeout_s
        for attempt in range(ATTEMPTS):
            gen = self.model.options(stream=True).stream.remote(job)
            try:
                first = await asyncio.wait_for(gen.__anext__(), deadline - loop.time())
                break
            except TimeoutError:
                gen.cancel()
                raise self._timeout() from None
            except StopAsyncIteration:
                first = None
                break
            except REPLICA_GONE as exc:
                last = exc
                self.retried += 1
                if attempt + 1 == ATTEMPTS or loop.time() + BACKOFF_S >= deadline:
                    raise RequestError(
                        UNAVAILABLE,
                        f"no model replica could start this completion ({type(last).__name__}); "
                        "try again shortly",
                        "server_error",
                    ) from None
                await asyncio.sleep(BACKOFF_S * (attempt + 1))
        if isinstance(first, RequestError):
            raise first
        return StreamingResponse(self._events(first, gen), media_type="text/event-stream")

    async def _events(self, first: Any, gen: Any) -> AsyncIterator[bytes]:
        try:
            async for event in self._event_stream(first, gen):
                yield event
        except (asyncio.CancelledError, GeneratorExit):
            gen.cancel()  # the client went away: the replica stops generating for it
            raise

    async def _event_stream(self, first: Any, gen: Any) -> AsyncIterator[bytes]:
        chunk = first
        timeout = self.limits.request_timeout_s
        while chunk is not None:
            if isinstance(chunk, RequestError):
                yield _event(chunk.body())
                break
            yield _event(chunk)
            try:
                chunk = await asyncio.wait_for(gen.__anext__(), timeout)
            except StopAsyncIteration:
                chunk = None
            except TimeoutError:
                gen.cancel()
                chunk = self._timeout()
            except REPLICA_GONE as exc:
                chunk = RequestError(
                    UNAVAILABLE,
                    f"the model replica making this completion died mid-way "
                    f"({type(exc).__name__}); the text so far is incomplete",
                    "server_error",
                )
        yield b"data: [DONE]\n\n"


def _name(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]


def _event(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, allow_nan=False).encode() + b"\n\n"


async def _awaited(response: Any) -> Any:
    return await response
