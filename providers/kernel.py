"""Kernel registrations: the ``@kernel`` decorator and the spec it records.

A kernel is a *builder*: called once per node at session creation with the
node's :class:`NodeInfo` and the provider's array namespace ``xp``, it parses
attributes and picks an implementation, and returns the callable that runs
the node. The callable takes the node's inputs (``None`` for an omitted
optional one, then the implicit outer-scope inputs) and returns a tuple with
one entry per output it computes. A builder declines a node it cannot run by
raising :class:`onnxep.errors.NotSupported` with a reason a person can act on.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from .node import NodeInfo

Builder = Callable[[NodeInfo, Any], Callable[..., tuple]]

#: The attribute ``@kernel`` leaves on a builder, read by :meth:`KernelLibrary.from_package`.
SPECS_ATTR = "__onnxep_kernels__"

#: The attribute :func:`direct` leaves on a built callable, read by the core's planner.
DIRECT_ATTR = "__onnxep_direct__"

#: The attribute :func:`not_capture_safe` leaves on a built callable (its note).
CAPTURE_ATTR = "__onnxep_not_capture_safe__"


def direct(run: Callable[..., tuple], f: Callable[..., Any], upcast: Iterable[Any] = ()) -> Any:
    """Say that ``run(*args)`` is ``(f(*args),)`` whenever no input's dtype is in ``upcast``
    and the one output has rank 1 or more; returns ``run``.

    Where the node's static types show both, the executor calls ``f`` itself and skips
    ``run``'s own dispatch and the tuple: on graphs of many tiny elementwise ops, that
    work costs as much as the op. (A NumPy ufunc returns a scalar, not an array, for a 0-d
    result, which ``run`` wraps; hence the rank condition.) ``run`` stays the kernel for
    every other case and for the checked first run.
    """
    setattr(run, DIRECT_ATTR, (f, frozenset(upcast)))
    return run


def not_capture_safe(run: Callable[..., tuple], note: str) -> Any:
    """Say that this built callable may not be recorded in a CUDA graph, and why; returns ``run``.

    For a kernel whose spec is capture-safe but which, for this node, takes a path that
    is not (a fallback decided when the node is built): the step becomes a seam with
    ``note`` as its reason. It only narrows: a spec that is not capture-safe stays so.
    """
    setattr(run, CAPTURE_ATTR, note or "its kernel is not capture-safe for this node")
    return run


def normalize_domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


@dataclass(frozen=True)
class KernelSpec:
    """One kernel registration.

    ``dtypes`` maps an input index to the ONNX type names (``"float"``,
    ``"float16"``...) the kernel accepts there; inputs not named accept any.
    ``host_inputs`` are inputs read on the host (shapes, axes, k), and
    ``host_outputs`` outputs produced in host memory (Shape, Size).
    ``inplace`` lists ``(input, output)`` pairs whose buffer the kernel may
    reuse. ``capture_safe`` says whether the step may be recorded in a CUDA
    graph; ``capture_note`` says why not.
    """

    op_type: str
    builder: Builder
    domain: str = ""
    since_version: int = 1
    dtypes: Mapping[int, frozenset[str]] | None = None
    host_inputs: tuple[int, ...] = ()
    host_outputs: tuple[int, ...] = ()
    inplace: tuple[tuple[int, int], ...] = ()
    capture_safe: bool = True
    capture_note: str = ""
    source: str = field(default="", compare=False)

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.domain, self.op_type, self.since_version)

    def dtype_refusal(self, op_type: str, input_dtypes: Sequence[Any]) -> str | None:
        """Why inputs of these dtypes (None where unknown) are refused, or None if accepted."""
        from .dtypes import dtype_name

        for i, allowed in (self.dtypes or {}).items():
            dt = input_dtypes[i] if i < len(input_dtypes) else None
            if dt is None:
                continue
            name = dtype_name(dt)
            if name not in allowed:
                return f"{op_type}: {name} not supported for input {i}"
        return None

    def with_source(self, source: str) -> KernelSpec:
        return KernelSpec(**{**self.__dict__, "source": source})


def _dtype_map(dtypes: Iterable[str] | Mapping[int, Iterable[str]] | None):
    if dtypes is None:
        return None
    if isinstance(dtypes, Mapping):
        return {int(k): frozenset(v) for k, v in dtypes.items()}
    return {0: frozenset(dtypes)}


def kernel(
    op_type: str,
    since: int | Iterable[int] = 1,
    *,
    domain: str = "",
    dtypes: Iterable[str] | Mapping[int, Iterable[str]] | None = None,
    host_inputs: Iterable[int] = (),
    host_outputs: Iterable[int] = (),
    inplace: Iterable[tuple[int, int]] = (),
    capture_safe: bool = True,
    capture_note: str = "",
) -> Callable[[Builder], Builder]:
    """Mark ``builder`` as the kernel for ``op_type`` from opset ``since`` on.

    ``since`` may list several versions the same builder handles (it reads
    ``node.opset`` where they differ). ``dtypes`` given as a plain collection
    constrains input 0. Decorators stack, one per op a builder serves.
    """
    versions = (since,) if isinstance(since, int) else tuple(since)
    dmap = _dtype_map(dtypes)

    def mark(builder: Builder) -> Builder:
        specs = list(getattr(builder, SPECS_ATTR, ()))
        for v in versions:
            specs.append(
                KernelSpec(
                    op_type=op_type,
                    builder=builder,
                    domain=normalize_domain(domain),
                    since_version=v,
                    dtypes=dmap,
                    host_inputs=tuple(host_inputs),
                    host_outputs=tuple(host_outputs),
                    inplace=tuple(inplace),
                    capture_safe=capture_safe,
                    capture_note=capture_note,
                )
            )
        setattr(builder, SPECS_ATTR, specs)
        return builder

    return mark


class KernelLibrary:
    """An ordered collection of kernel specs, usually built from a package of op modules."""

    def __init__(
        self, specs: Iterable[KernelSpec] = (), failures: Iterable[tuple[str, str]] = ()
    ) -> None:
        self.specs: list[KernelSpec] = list(specs)
        #: ``(module, error)`` for op modules that failed to import; the host reports them.
        self.failures: list[tuple[str, str]] = list(failures)

    def __iter__(self) -> Iterator[KernelSpec]:
        return iter(self.specs)

    def __len__(self) -> int:
        return len(self.specs)

    @staticmethod
    def from_module(module: ModuleType) -> KernelLibrary:
        specs: list[KernelSpec] = []
        for obj in vars(module).values():
            if callable(obj) and getattr(obj, "__module__", None) == module.__name__:
                specs.extend(getattr(obj, SPECS_ATTR, ()))
        return KernelLibrary(specs)

    @staticmethod
    def from_package(package: str | ModuleType, prefix: str = "op_") -> KernelLibrary:
        """Every kernel in the modules of ``package`` whose names start with ``prefix``."""
        pkg = importlib.import_module(package) if isinstance(package, str) else package
        specs: list[KernelSpec] = []
        failures: list[tuple[str, str]] = []
        for info in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
            if info.name.startswith(prefix):
                name = f"{pkg.__name__}.{info.name}"
                try:
                    mod = importlib.import_module(name)
                except Exception as exc:
                    # One broken op module must not take the other ops down with it.
                    failures.append((name, f"{type(exc).__name__}: {exc}"))
                    continue
                specs.extend(KernelLibrary.from_module(mod))
        return KernelLibrary(specs, failures)

    def __add__(self, other: KernelLibrary) -> KernelLibrary:
        return KernelLibrary([*self, *other], [*self.failures, *other.failures])

    def op_types(self) -> set[tuple[str, str]]:
        return {(s.domain, s.op_type) for s in self.specs}
