"""A provider's kernel table, keyed by ``(domain, op_type, since_version)``."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from .kernel import KernelSpec, normalize_domain


def _op(domain: str, op_type: str) -> str:
    return f"{domain or 'ai.onnx'}::{op_type}"


@dataclass(frozen=True)
class KernelConflict:
    """Two plugins registered a kernel for the same key; the first one is kept."""

    kind: ClassVar[str] = "refused"

    key: tuple[str, str, int]
    kept: str
    refused: str

    def __str__(self) -> str:
        dom, op, ver = self.key
        return (
            f"kernel {_op(dom, op)} since opset {ver} registered by {self.refused!r} "
            f"is ignored: {self.kept!r} registered it first"
        )


@dataclass(frozen=True)
class KernelShadowed:
    """A plugin's kernels for one op, all below another plugin's registration of it.

    From opset ``by_since`` on, lookup picks ``by``'s kernel (or a newer one),
    so ``source``'s kernels only ever run for models older than that.
    """

    kind: ClassVar[str] = "shadowed"

    domain: str
    op_type: str
    source: str
    versions: tuple[int, ...]
    by: str
    by_since: int

    @property
    def refused(self) -> str:
        """The plugin whose registration is set aside (named as for a conflict)."""
        return self.source

    def __str__(self) -> str:
        since = ", ".join(map(str, self.versions))
        return (
            f"kernel {_op(self.domain, self.op_type)} registered by {self.source!r} "
            f"(since opset {since}) is shadowed by {self.by!r}'s kernel since opset "
            f"{self.by_since}: models of opset {self.by_since} or newer never use it"
        )


class KernelRegistry:
    """Kernels one provider can run.

    Lookup takes the registration with the highest ``since_version`` not above
    the model's opset for that domain. Re-registering a key from the same
    source replaces it (a provider overriding its own generic kernel); from a
    different source it is refused and recorded in ``conflicts``.
    :meth:`check_shadowed` finds a source's registrations that an earlier
    source's higher ``since`` hides, and records them in ``shadowed``.
    ``missing`` lists kernel sets that failed to arrive (a plugin's
    ``onnxep_kernels`` raised), so a "no kernel" decline can say why.
    """

    def __init__(self) -> None:
        self._table: dict[tuple[str, str], list[tuple[int, KernelSpec]]] = {}
        self.conflicts: list[KernelConflict] = []
        self.shadowed: list[KernelShadowed] = []
        self.missing: list[str] = []

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

    def check_shadowed(self, source: str) -> list[KernelShadowed]:
        """Record and return ``source``'s ops whose every version is below another source's.

        Call it once a source has added all its kernels: an op counts when the
        newest version ``source`` registered is older than some other
        source's registration of the same op, which then wins at every opset
        from its ``since`` on. The first such registration above is named.
        """
        found: list[KernelShadowed] = []
        for (dom, op), entries in self._table.items():
            mine = tuple(v for v, s in entries if s.source == source)
            if not mine:
                continue
            above = [(v, s.source) for v, s in entries if v > mine[-1] and s.source != source]
            if not above:
                continue
            by_since, by = above[0]
            rec = KernelShadowed(dom, op, source, mine, by, by_since)
            if rec not in self.shadowed:
                self.shadowed.append(rec)
                found.append(rec)
        return found

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
