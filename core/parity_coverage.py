"""How much of a model the provider under test really ran, for the parity kit.

Outputs that agree say nothing about a provider that ran none of the nodes behind
them: they came from the same fallback kernels on both sides. So a parity report
counts, per provider list, the compute nodes (host shape computations left out) the
list's first provider ran, in total and behind each output, and names the nodes that
fell back with the reasons. ``min_coverage`` (a fraction of the compute nodes) turns
too little into a failure; by default the provider must run at least one node.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Coverage:
    """The compute nodes ``provider`` ran of a session's, and those it left to others."""

    provider: str
    ran: int
    total: int
    #: (node, op_type, the provider that ran it, why ``provider`` declined it)
    fell_back: tuple[tuple[str, str, str, str], ...] = ()
    #: output -> (nodes behind it the provider ran, compute nodes behind it)
    per_output: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def fraction(self) -> float:
        return self.ran / self.total if self.total else 1.0

    def below(self, min_coverage: float | None) -> str | None:
        """Why this coverage fails ``min_coverage`` (None: at least one node), else None."""
        if self.total == 0:
            return None
        if min_coverage is None:
            if self.ran == 0:
                return (
                    f"provider {self.provider!r} ran none of the {self.total} compute nodes: "
                    "the outputs were compared against the same fallback kernels"
                )
            return None
        if self.fraction + 1e-12 < min_coverage:
            return (
                f"provider {self.provider!r} ran {self.ran} of {self.total} compute nodes "
                f"({self.fraction:.0%}), under min_coverage {min_coverage:.0%}"
            )
        return None

    def summary(self) -> str:
        head = (
            f"coverage: {self.provider} ran {self.ran} of {self.total} compute nodes "
            f"({self.fraction:.0%})"
        )
        if not self.fell_back:
            return head
        by_op = Counter((op, to, why) for _, op, to, why in self.fell_back)
        lines = [head + "; fell back:"]
        for (op, to, why), n in by_op.most_common():
            lines.append(f"  {n} x {op} -> {to}: {why}")
        return "\n".join(lines)


def coverage_of(session: Any) -> Coverage:
    """The coverage of ``session``'s first provider."""
    rep = session.placement()
    tested = session.get_providers()[0]
    compute = [n for n in rep.nodes if n.role == "compute"]
    ran = {n.node for n in compute if n.provider == tested}
    fell = []
    for n in compute:
        if n.provider == tested:
            continue
        why = next((r for p, r in n.declined if p == tested), "not claimed")
        fell.append((n.node, n.op_type, n.provider, why))
    names = {n.node for n in compute}
    per_output = {}
    for out, nodes in rep.output_nodes.items():
        behind = [x for x in nodes if x in names]
        per_output[out] = (sum(1 for x in behind if x in ran), len(behind))
    return Coverage(tested, len(ran), len(compute), tuple(fell), per_output)
