"""The Provider base class and the records a provider hands the core."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from onnxep.errors import NotSupported, with_cause

from .kernel import KernelSpec
from .node import NodeInfo
from .registry import KernelRegistry


@dataclass(frozen=True)
class ProviderInfo:
    """What a plugin says about the provider it offers.

    ``check`` returns ``None`` when the provider can run here and now, else a
    sentence saying why not ("no CUDA driver found: install ..."). It must be
    cheap and must not raise.
    """

    name: str
    aliases: tuple[str, ...] = ()
    device: str = "cpu"
    version: str = "0"
    description: str = ""
    check: Callable[[], str | None] = field(default=lambda: None, compare=False)

    def unavailable_reason(self) -> str | None:
        try:
            return self.check()
        except Exception as exc:  # a broken check is a reason, not a crash
            return f"availability check raised {type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class Claim:
    """A provider's acceptance of a node: the built callable and the kernel behind it."""

    fn: Callable[..., Any]
    spec: KernelSpec


@dataclass(frozen=True)
class Decline:
    """A provider's refusal of a node, with a reason a person can act on."""

    reason: str


class Provider:
    """Base of every execution provider.

    A provider owns a :class:`KernelRegistry` (filled through the
    ``onnxep_kernels`` hook), an array namespace ``xp`` its kernels compute
    with, and a ``device`` string naming where its arrays live; providers with
    the same device exchange values without copies. Subclasses override the
    transfer methods when their arrays are not NumPy arrays.
    """

    def __init__(
        self,
        name: str,
        options: Mapping[str, Any] | None = None,
        *,
        device: str = "cpu",
        xp: Any = np,
    ) -> None:
        self.name = name
        self.options: dict[str, Any] = dict(options or {})
        self.device = device
        self.xp = xp
        self.registry = KernelRegistry()

    # -- claiming -------------------------------------------------------------
    def claim(self, node: NodeInfo) -> Claim | Decline:
        """Claim ``node`` with a built kernel, or decline it with a reason."""
        spec = self.registry.lookup(node.domain, node.op_type, node.opset)
        if spec is None:
            return Decline(self._no_kernel_reason(node))
        reason = self.check_dtypes(spec, node)
        if reason:
            return Decline(reason)
        try:
            fn = spec.builder(node, self.xp)
        except NotSupported as exc:
            return Decline(str(exc))
        except Exception as exc:
            return Decline(f"{node.op_type}: kernel builder failed: {with_cause(exc, limit=2000)}")
        return Claim(fn, spec)

    def _no_kernel_reason(self, node: NodeInfo) -> str:
        dom = node.domain or "ai.onnx"
        versions = self.registry.versions(node.domain, node.op_type)
        # Kernels a plugin failed to add may be the ones missing here.
        missing = "".join(f" ({m})" for m in self.registry.missing)
        if versions:
            return (
                f"{node.op_type}: no kernel for {dom} opset {node.opset} "
                f"(kernels exist from opset {versions[0]}){missing}"
            )
        return f"{node.op_type}: no kernel for {dom}::{node.op_type}{missing}"

    @staticmethod
    def check_dtypes(spec: KernelSpec, node: NodeInfo) -> str | None:
        return spec.dtype_refusal(node.op_type, [v.dtype if v else None for v in node.inputs])

    # -- data movement ----------------------------------------------------------
    def to_host(self, value: Any) -> Any:
        """Copy one of this provider's arrays into host (NumPy) memory."""
        return value

    def from_host(self, value: Any) -> Any:
        """Copy a host (NumPy) array onto this provider's device."""
        return value

    def to_host_async(self, value: Any) -> Callable[[], Any]:
        """Start copying one of this provider's arrays into host memory; the returned callable
        waits for that copy alone (not for work queued after it) and returns the host array,
        so a caller can queue more work before it reads. A host provider copies nothing."""
        host = self.to_host(value)
        return lambda: host

    def argmax_rows_into(self, x: Any, out: Any) -> None:
        """``out`` (int64, one entry per row) gets the argmax of each row of the 2-D ``x``
        (ties and NaN as NumPy's argmax), on this provider's device and without waiting for
        it: greedy decoding writes the next step's token ids there."""
        out[...] = self.xp.argmax(x, axis=-1).astype(out.dtype).reshape(out.shape)

    def synchronize(self) -> None:
        """Wait for work queued on the device; a host provider has none."""

    def run_context(self) -> contextlib.AbstractContextManager[Any] | None:
        """A context the executor enters around every run, on the calling thread.

        A device provider returns one that makes its device, stream and memory
        pool current (CuPy keeps those per thread); ``None`` means nothing to
        enter. Only providers that override this method cost anything per run.
        """
        return None

    def session_notes(self) -> list[str]:
        """Sentences about settings this provider settled for its session (the CPU
        provider's BLAS threads), shown by ``InferenceSession.placement()`` and ``onnxep
        explain``; asked after the session's plan is built."""
        return []

    # -- device arrays: IO binding and onnxep.generate ---------------------------------
    # A device provider overrides these to take a caller's arrays without a copy; the core
    # asks ``implements(name)`` first and never calls a default, which names what is missing.
    def adopt(self, value: Any) -> Any:
        """This provider's view of a caller's device array (its own kind, an object with
        ``__cuda_array_interface__``, a DLPack producer), without a copy."""
        raise NotSupported(f"provider {self.name!r} takes no bound device arrays (adopt)")

    def wrap_pointer(self, ptr: int, shape: tuple[int, ...], dtype: Any) -> Any:
        """An array over device memory the caller owns (onnxruntime's ``buffer_ptr`` form)."""
        raise NotSupported(
            f"provider {self.name!r} cannot wrap a raw device pointer (wrap_pointer)"
        )

    def copy_into(self, dst: Any, src: Any) -> None:
        """Write ``src`` (host or device) into this provider's array ``dst`` in place."""
        raise NotSupported(
            f"provider {self.name!r} cannot write into a bound device buffer (copy_into)"
        )

    def transfer_counts(self) -> dict[str, int]:
        """Copies made so far (cumulative): ``device_to_host``, ``host_to_device``."""
        raise NotSupported(f"provider {self.name!r} does not count its copies (transfer_counts)")

    def implements(self, method: str) -> bool:
        """True when this provider (its class, or the instance itself) overrides the base
        class's ``method``: ``adopt``, ``wrap_pointer``, ``copy_into``, ``transfer_counts``,
        ``run_context``."""
        base = getattr(Provider, method)
        own = getattr(self, method, None)
        return own is not None and getattr(own, "__func__", own) is not base

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} on {self.device}>"
