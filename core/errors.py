"""The typed errors onnxep raises.

Every error a user can cause derives from :class:`OnnxepError`, and from the
builtin exception a Python user would expect (``ValueError`` for bad input,
``NotImplementedError`` for an op nobody can run), so ``except ValueError``
keeps working for code written against onnxruntime.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "FallbackError",
    "InvalidArgument",
    "InvalidGraph",
    "InvalidModel",
    "NotImplementedOp",
    "NotSupported",
    "OnnxepError",
    "ProviderError",
    "RunError",
    "with_cause",
]


class OnnxepError(Exception):
    """Base of every onnxep error."""


class InvalidArgument(OnnxepError, ValueError):
    """A call got a bad argument: a missing or extra feed, a wrong dtype or shape."""


class InvalidModel(OnnxepError, ValueError):
    """The model file or bytes could not be read as an ONNX model."""


class InvalidGraph(OnnxepError, ValueError):
    """The model parsed but its graph is not valid."""


class ConfigError(OnnxepError, ValueError):
    """plugins.toml or provider options are wrong."""


class ProviderError(OnnxepError, RuntimeError):
    """A provider that was asked for cannot be used: not installed, failed, unavailable."""


class NotImplementedOp(OnnxepError, NotImplementedError):
    """No provider in the session can run a node."""


class FallbackError(OnnxepError, RuntimeError):
    """``disable_fallback`` is set and a compute node left the first provider."""


class RunError(OnnxepError, RuntimeError):
    """A kernel failed while the session ran; the message names the node."""


class NotSupported(OnnxepError):
    """Raised by a kernel builder to decline a node; the message is the reason."""


def with_cause(exc: BaseException, limit: int = 400) -> str:
    """``Type: message`` of ``exc``, with its innermost cause appended when it wraps one.

    Libraries wrap errors in errors of their own (onnx-ir's SerdeError around the
    NotImplementedError that says what is wrong); the wrapper alone rarely says
    what to fix, so every message onnxep builds from a caught error carries the
    innermost one of the chain (``raise ... from``, or raised while handling it).
    Each part is cut at ``limit`` characters: some wrappers quote whole protos.
    """

    def part(e: BaseException) -> str:
        text = f"{type(e).__name__}: {e}".strip()
        return text if len(text) <= limit else text[: limit - 3] + "..."

    inner, seen = exc, {id(exc)}
    while True:
        nxt = inner.__cause__
        if nxt is None and not inner.__suppress_context__:
            nxt = inner.__context__
        if nxt is None or id(nxt) in seen:
            break
        seen.add(id(nxt))
        inner = nxt
    if inner is exc:
        return part(exc)
    return f"{part(exc)} (innermost cause: {part(inner)})"
