"""What one request may ask of a server, and the 4xx error a request gets.

Every limit has a default and an ``onnxep serve`` option; a request over one
is refused before any work is done on it (413 for the body's bytes, 422 for
what it asks: rows, tokens, prompts), and the message names the limit and the
option that raises it, so a client knows what to change and an operator what
to set.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

#: HTTP statuses the server answers with, by what went wrong
BAD_REQUEST, NOT_FOUND, NOT_ALLOWED, NOT_ACCEPTABLE = 400, 404, 405, 406
TOO_LARGE, UNPROCESSABLE = 413, 422
UNAVAILABLE, TIMEOUT = 503, 504


class RequestError(Exception):
    """A request the server will not serve: its HTTP status and one sentence saying why.

    ``kind`` is the OpenAI error type (``invalid_request_error`` for anything the client can
    fix, ``server_error`` for the rest), carried in every error body.
    """

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind

    def __reduce__(self) -> tuple:
        # crosses Ray between the replica and the ingress; the default pickles args only
        return (RequestError, (self.status, self.message, self.kind))

    def body(self) -> dict[str, Any]:
        """The JSON body of the error response, in OpenAI's shape on every route."""
        return {"error": {"message": self.message, "type": self.kind, "code": self.status}}


@dataclass(frozen=True)
class Limits:
    """The most one request may ask for; each field is an ``onnxep serve`` option."""

    #: bytes of a request body (JSON or .npz), and of the arrays an .npz unpacks to
    max_body_bytes: int = 64 * 1024 * 1024
    #: rows of one /infer request along the model's batch axis, and prompts of one completion
    max_rows: int = 256
    #: max_tokens (max_completion_tokens) of one completion
    max_tokens: int = 2048
    #: tokens of one prompt, after the chat template
    max_prompt_tokens: int = 8192
    #: seconds the server waits for a replica's answer (for a stream: for each piece)
    request_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"Limits.{f.name} must be a number above 0, got {value!r}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def option(cls, field: str) -> str:
        """The ``onnxep serve`` option that sets ``field``."""
        return "--" + field.replace("_", "-")


def over_limit(status: int, what: str, value: int, limits: Limits, field: str) -> RequestError:
    """The error for ``what`` (e.g. "the prompt") being ``value`` against ``field``'s limit."""
    limit = getattr(limits, field)
    return RequestError(
        status,
        f"{what} is {value:,}, over this server's limit of {limit:,} ({field}; the operator "
        f"raises it with onnxep serve {Limits.option(field)})",
    )
