"""A provider's kernel table, keyed by ``(domain, op_type, since_version)``."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass

from .kernel import KernelSpec, normalize_domain


@dataclass(frozen=True)
class KernelConflict:
    """Two plugins registered a kernel for the same key; the first one is kept."""

    key: tuple[str, str, int]
    kept: str
    refused: str

    def __str__(self) -> str:
        dom, op, ver = self.key
        return (
            f"kernel {dom or 'ai.onnx'}::{op} since opset {ver} registered by {self.refused!r} "
            f"is ignored: {self.kept!r} registered it first"
        )


class KernelRegistry:
    """Kernels one provider can run.

    Lookup takes the registration with the highest ``since_version`` not above
    the model's opset for that domain. Re-registering a key from the same
    source replaces it (a provider overriding its own generic kernel); from a
    different source it is refused and recorded in ``conflicts``.
    """

    def __init__(self) -> None:
        self._table: dict[tuple[str, str], list[tuple[int, KernelSpec]]] = {}
        self.conflicts: list[KernelConflict] = []

    def add(self, spec: KernelSpec, source: str | None = None) -> None:
        if source is not None:
            spec = spec.with_source(source)
        entries = self._table.setdefault((spec.domain, spec.op_type), [])
        versions = [v for v, _ in entries]
        i = bisect.bisect_left(versions, spec.since_version)
        if i < len(entries) and entries[i][0] == spec.since_version:
            old = entries[i][1]
            if old.source and spec.source and old.source != spec.source:
                self.conflicts.append(KernelConflict(spec.key, old.source, spec.source))
                return
            entries[i] = (spec.since_version, spec)
        else:
            entries.insert(i, (spec.since_version, spec))

    def extend(self, specs: Iterable[KernelSpec], source: str | None = None) -> None:
        for s in specs:
            self.add(s, source)

    def lookup(self, domain: str, op_type: str, opset: int) -> KernelSpec | None:
        entries = self._table.get((normalize_domain(domain), op_type))
        if not entries:
            return None
        best = None
        for v, spec in entries:
            if v <= opset:
                best = spec
            else:
                break
        return best

    def versions(self, domain: str, op_type: str) -> list[int]:
        return [v for v, _ in self._table.get((normalize_domain(domain), op_type), [])]

    def op_types(self) -> set[tuple[str, str]]:
        return set(self._table)

    def __contains__(self, key: tuple[str, str]) -> bool:
        dom, op = key
        return (normalize_domain(dom), op) in self._table

    def __len__(self) -> int:
        return sum(len(v) for v in self._table.values())
