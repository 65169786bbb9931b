"""Op coverage per domain: which provider has a kernel for each op of a domain, from which
versions, and why the others are declined (``onnxep coverage``).

The op list of a domain is the union of onnx's schemas (every version, deprecated ones
included), onnxruntime's schemas when onnxruntime is installed (its contrib domains,
com.microsoft among them) and the kernels the providers register, so ops a plugin adds
show up without a change here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Why an op of these domains has no kernel, where that is known and not just "not yet".
DECLINED: dict[tuple[str, str], str] = {}


@dataclass
class OpCoverage:
    domain: str
    op: str
    schema_versions: tuple[int, ...] = ()
    deprecated_from: int | None = None
    kernels: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def covered(self) -> bool:
        return bool(self.kernels)

    def reason(self) -> str:
        if self.covered:
            return ""
        return DECLINED.get((self.domain, self.op), "no kernel in any provider")


def _schemas(domain: str) -> dict[str, tuple[list[int], int | None]]:
    import onnx

    out: dict[str, tuple[list[int], int | None]] = {}
    sources: list[Iterable[Any]] = [onnx.defs.get_all_schemas_with_history()]
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

        sources.append(ort_state.get_all_operator_schema())
    except (ImportError, AttributeError):
        pass
    for schemas in sources:
        for s in schemas:
            if (s.domain or "") != domain:
                continue
            versions, dep = out.setdefault(s.name, ([], None))
            if getattr(s, "deprecated", False):
                dep = s.since_version if dep is None else min(dep, s.since_version)
            elif s.since_version not in versions:
                versions.append(s.since_version)
            out[s.name] = (versions, dep)
    return out


def coverage(providers: Sequence[Any], domains: Sequence[str]) -> list[OpCoverage]:
    """One row per op of each domain, in domain then op order."""
    from onnxep.providers.discovery import get_host

    from .config import load_config
    from .providers_select import create_providers, select_providers

    host = get_host(load_config())
    started = create_providers(host, select_providers(host, list(providers), None))
    rows: list[OpCoverage] = []
    for domain in domains:
        schemas = _schemas(domain)
        ops = set(schemas)
        for p in started:
            ops |= {op for d, op in p.registry.op_types() if d == domain}
        for op in sorted(ops):
            versions, dep = schemas.get(op, ([], None))
            row = OpCoverage(domain, op, tuple(sorted(versions)), dep)
            for p in started:
                got = p.registry.versions(domain, op)
                if got:
                    row.kernels[p.name] = tuple(sorted(got))
            rows.append(row)
    return rows


def format_coverage(rows: Sequence[OpCoverage]) -> str:
    lines: list[str] = []
    for domain in dict.fromkeys(r.domain for r in rows):
        mine = [r for r in rows if r.domain == domain]
        done = sum(r.covered for r in mine)
        lines.append(f"{domain}: {done} of {len(mine)} ops have a kernel")
        lines.append(f"  {'op':34s} {'schema versions':18s} kernels (provider: since versions)")
        for r in mine:
            sv = ",".join(map(str, r.schema_versions)) or "-"
            if r.deprecated_from is not None:
                sv += f" (deprecated {r.deprecated_from})"
            ks = "; ".join(f"{p}: {','.join(map(str, v))}" for p, v in r.kernels.items())
            lines.append(f"  {r.op:34s} {sv:18s} {ks or 'DECLINED: ' + r.reason()}")
        lines.append("")
    return "\n".join(lines)
