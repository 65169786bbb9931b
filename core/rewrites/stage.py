"""The rewrite stage of a session: plugins' basic passes on the whole graph, then each
provider's fusions on the nodes it would be given."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from onnxep.providers import FusionPass, Provider

from ..compile.partition import ownership
from ..compile.placement import FusionReport
from .manager import RewriteManager

__all__ = ["RewriteOutcome", "rewrite_basic", "rewrite_extended"]


@dataclass
class RewriteOutcome:
    """What the rewrites did, for the placement report."""

    counts: dict[str, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    fusions: list[FusionReport] = field(default_factory=list)
    #: basic passes' refused matches (those that keep them): pass -> reason -> nodes
    refusals: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)


def rewrite_basic(
    model: Any, host: Any, cpu: Provider | None, disabled: Sequence[str], out: RewriteOutcome
) -> None:
    """The ``basic`` passes (constant folding evaluates with ``cpu``'s kernels)."""
    passes = host.rewrites(cpu, "basic")
    report = RewriteManager(passes, disabled).run(model)
    out.counts.update(report.counts)
    out.skipped += report.skipped
    for p in passes:
        name, refused = getattr(p, "name", ""), getattr(p, "refusals", None)
        if refused and name not in disabled:
            out.refusals[name] = {r: tuple(nodes) for r, nodes in refused.items()}


def rewrite_extended(
    model: Any,
    host: Any,
    providers: Sequence[Provider],
    opsets: dict[str, int],
    disabled: Sequence[str],
    out: RewriteOutcome,
) -> None:
    """Each provider's fusions, on the nodes it would be given (``extended`` level).

    A fusion pass that breaks the rewrite contract is rolled back by the
    manager; it is recorded against its plugin and listed as skipped.
    """
    owner = ownership(providers, opsets)
    for provider in providers:
        sourced = host.rewrites_by_plugin(provider, "extended")
        passes = [p for _, p in sourced]
        plugin_of = {id(p): plugin for plugin, p in sourced}
        for p in passes:
            if isinstance(p, FusionPass):
                p.bind(provider, lambda n, prov=provider: owner(n) is prov, opsets)
        report = RewriteManager(passes, disabled).run(model)
        for name, count in report.counts.items():
            out.counts[name] = out.counts.get(name, 0) + count
        out.skipped += [s for s in report.skipped if s not in out.skipped]
        rolled_back = {id(r.rewrite) for r in report.rejected}
        out.fusions += [
            FusionReport.of(p, provider.name, disabled, id(p) in rolled_back) for p in passes
        ]
        for rejected in report.rejected:
            plugin = plugin_of.get(id(rejected.rewrite), "?")
            host.pass_rolled_back(plugin, provider.name, str(rejected))
