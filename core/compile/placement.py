"""The placement report: who runs each node, why others declined, and every copy."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class NodePlacement:
    """One node's provider, its role, and the reasons of the providers ahead that declined."""

    node: str
    op_type: str
    domain: str
    provider: str
    role: str = "compute"
    declined: tuple[tuple[str, str], ...] = ()

    @property
    def fell_back(self) -> bool:
        return bool(self.declined)


@dataclass(frozen=True)
class CopyPlacement:
    value: str
    src: str
    dst: str
    consumer: str


@dataclass(frozen=True)
class FusionReport:
    """One provider's fusion pass: fires per rule, refused matches by reason, and its state.

    ``refused`` maps each reason to the anchor nodes of the matches refused for
    it; ``state`` is ``"on"``, ``"off"`` (switched off) or ``"rolled back"``
    (it broke the rewrite contract); ``exact`` is whether the pass claims
    byte-identical results (None when it does not say).
    """

    name: str
    provider: str
    fired: int = 0
    by_rule: dict[str, int] = field(default_factory=dict)
    refused: dict[str, tuple[str, ...]] = field(default_factory=dict)
    state: str = "on"
    exact: bool | None = None

    @classmethod
    def of(
        cls, p: Any, provider: str, off: Collection[str] = (), rolled_back: bool = False
    ) -> FusionReport:
        """The report of pass ``p`` after the session ran it (read through duck typing, so a
        third party's pass without refusals or per-rule counts reports its count alone)."""
        name = getattr(p, "name", "") or type(p).__name__
        state = "off" if name in off else "rolled back" if rolled_back else "on"
        refusals = getattr(p, "refusals", None) or {}
        return cls(
            name=name,
            provider=provider,
            fired=int(getattr(p, "count", 0)),
            by_rule=dict(getattr(p, "fired", None) or {}),
            refused={r: tuple(nodes) for r, nodes in refusals.items()},
            state=state,
            exact=getattr(p, "exact", None),
        )

    @property
    def refused_count(self) -> int:
        return sum(len(v) for v in self.refused.values())

    def format(self, examples: int = 3) -> list[str]:
        head = f"{self.provider}/{self.name}:"
        if self.state != "on":
            return [f"{head} {self.state}"]
        rules = ", ".join(f"{k} {v}" for k, v in sorted(self.by_rule.items()) if v)
        lines = [f"{head} fired {self.fired}" + (f" ({rules})" if rules else "")]
        for reason, nodes in sorted(self.refused.items(), key=lambda kv: -len(kv[1])):
            shown = ", ".join(nodes[:examples]) + (", ..." if len(nodes) > examples else "")
            lines.append(f"    refused {len(nodes)} x {reason}: {shown}")
        return lines

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "provider": self.provider,
            "state": self.state,
            "exact": self.exact,
            "fired": self.fired,
            "by_rule": dict(self.by_rule),
            "refused": {r: list(n) for r, n in self.refused.items()},
        }


@dataclass(frozen=True)
class CandidateTiming:
    """One placement ``placement="measured"`` considered: what it is, what it cost.

    ``times_ms`` are the timed runs (after the warm-up runs, which took ``warmup_ms``);
    ``skipped`` says why a candidate was not timed (or stopped early), empty when it
    ran every round.
    """

    name: str
    rule: str
    providers: tuple[str, ...]
    counts: dict[str, int] = field(default_factory=dict)
    copies: int = 0
    compile_ms: float = 0.0
    warmup_ms: float | None = None
    times_ms: tuple[float, ...] = ()
    skipped: str = ""

    @property
    def runs(self) -> int:
        return len(self.times_ms)

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.times_ms) if self.times_ms else None

    def format(self) -> str:
        nodes = ", ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
        head = f"{self.name} [{', '.join(self.providers)}]: "
        if self.median_ms is not None:
            head += f"median {self.median_ms:.3f} ms over {self.runs} run(s)"
            if self.warmup_ms is not None:
                head += f" (warm-up {self.warmup_ms:.3f} ms in all)"
        else:
            head += "not timed"
        detail = f"nodes {nodes}; copies {self.copies}; compiled in {self.compile_ms:.1f} ms"
        tail = f"; {self.skipped}" if self.skipped else ""
        return f"{head}\n      {self.rule}; {detail}{tail}"

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "rule": self.rule,
            "providers": list(self.providers),
            "counts": dict(self.counts),
            "copies": self.copies,
            "compile_ms": self.compile_ms,
            "warmup_ms": self.warmup_ms,
            "times_ms": list(self.times_ms),
            "runs": self.runs,
            "median_ms": self.median_ms,
            "skipped": self.skipped,
        }


@dataclass(frozen=True)
class MeasuredPlacement:
    """What ``placement="measured"`` timed and why it kept the placement it kept."""

    chosen: str
    reason: str
    budget_ms: float
    spent_ms: float
    island_nodes: int
    margin: float
    #: each timing feed as ``dtype[shape]``
    feeds: dict[str, str] = field(default_factory=dict)
    candidates: tuple[CandidateTiming, ...] = ()

    def __getitem__(self, name: str) -> CandidateTiming:
        for c in self.candidates:
            if c.name == name:
                return c
        raise KeyError(name)

    def format(self) -> list[str]:
        feeds = ", ".join(f"{k} {v}" for k, v in self.feeds.items()) or "none"
        lines = [
            f"placement measured (budget {self.budget_ms:g} ms, spent {self.spent_ms:.1f} ms; "
            f"feeds: {feeds}):"
        ]
        lines += [f"  - {c.format()}" for c in self.candidates]
        lines.append(f"  chose {self.chosen!r}: {self.reason}")
        return lines

    def to_dict(self) -> dict:
        return {
            "chosen": self.chosen,
            "reason": self.reason,
            "budget_ms": self.budget_ms,
            "spent_ms": self.spent_ms,
            "island_nodes": self.island_nodes,
            "margin": self.margin,
            "feeds": dict(self.feeds),
            "candidates": [c.to_dict() for c in self.candidates],
        }


@dataclass
class PlacementReport:
    """What ``InferenceSession.placement()`` returns; iterating yields the node entries."""

    providers: list[str]
    nodes: list[NodePlacement] = field(default_factory=list)
    #: What loading read in a normal form that onnxruntime accepts as it is (a negative dim
    #: read as unknown, a domain used but not imported...), one sentence each.
    load_notes: list[str] = field(default_factory=list)
    #: per provider, the settings it settled for the session (Provider.session_notes)
    provider_notes: dict[str, list[str]] = field(default_factory=dict)
    copies: list[CopyPlacement] = field(default_factory=list)
    rewrites: dict[str, int] = field(default_factory=dict)
    skipped_rewrites: list[str] = field(default_factory=list)
    fusions: list[FusionReport] = field(default_factory=list)
    #: per graph output, the nodes of the main graph it is computed from
    output_nodes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: the rewrite passes' refused matches: pass name -> reason -> nodes (see each pass)
    rewrite_refusals: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    #: how ``placement="measured"`` chose this placement (None: the priority order)
    measured: MeasuredPlacement | None = None
    #: the plans' steps (every graph, subgraphs included), and how many of them the
    #: executor calls directly, without the kernel's own dispatch (kernel.direct)
    steps: int = 0
    direct_steps: int = 0
    #: of those, the elementwise steps that write into a dead intermediate (codegen)
    in_place_steps: int = 0

    def __iter__(self):
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, name: str) -> NodePlacement:
        for n in self.nodes:
            if n.node == name:
                return n
        raise KeyError(name)

    def counts(self) -> dict[str, int]:
        return dict(Counter(n.provider for n in self.nodes))

    @property
    def fallbacks(self) -> list[NodePlacement]:
        return [n for n in self.nodes if n.fell_back]

    @property
    def device_to_host_copies(self) -> int:
        """Device-to-host copy steps in the plan, graph outputs included."""
        return sum(1 for c in self.copies if c.dst == "cpu" and c.src != "cpu")

    @property
    def device_to_host_reads(self) -> int:
        """Device-to-host reads one ``run`` makes: each copy step runs once per run
        (those inside a Loop or Scan body once per iteration). A provider that
        counts its copies (the CUDA provider's ``transfer_counts()``) measures it."""
        return self.device_to_host_copies

    def to_dict(self) -> dict:
        return {
            "providers": self.providers,
            "load_notes": list(self.load_notes),
            "provider_notes": {k: list(v) for k, v in self.provider_notes.items()},
            "counts": self.counts(),
            "nodes": [
                {
                    "node": n.node,
                    "op_type": n.op_type,
                    "domain": n.domain,
                    "provider": n.provider,
                    "role": n.role,
                    "declined": [{"provider": p, "reason": r} for p, r in n.declined],
                }
                for n in self.nodes
            ],
            "copies": [c.__dict__ for c in self.copies],
            "device_to_host_reads": self.device_to_host_reads,
            "rewrites": self.rewrites,
            "skipped_rewrites": self.skipped_rewrites,
            "steps": self.steps,
            "direct_steps": self.direct_steps,
            "in_place_steps": self.in_place_steps,
            "fusions": [f.to_dict() for f in self.fusions],
            "rewrite_refusals": {
                k: {r: list(n) for r, n in v.items()} for k, v in self.rewrite_refusals.items()
            },
            "measured": None if self.measured is None else self.measured.to_dict(),
        }

    def format(self, max_nodes: int | None = None) -> str:
        lines = [f"providers: {', '.join(self.providers)}"]
        if self.load_notes:
            lines.append("load notes:")
            lines += [f"  - {note}" for note in self.load_notes]
        for name, notes in self.provider_notes.items():
            lines += [f"{name}: {note}" for note in notes]
        counts = self.counts()
        lines.append(
            "nodes per provider: " + ", ".join(f"{k}={v}" for k, v in sorted(counts.items()))
        )
        host = [n for n in self.nodes if n.role == "host-shape"]
        if host:
            lines.append(f"shape computations on the host: {len(host)}")
        lines.append(
            f"copies: {len(self.copies)} (device-to-host reads per run: "
            f"{self.device_to_host_reads})"
        )
        if self.rewrites:
            lines.append(
                "rewrites: " + ", ".join(f"{k}={v}" for k, v in sorted(self.rewrites.items()))
            )
        if self.skipped_rewrites:
            lines.append("rewrites switched off: " + ", ".join(self.skipped_rewrites))
        for name, refused in sorted(self.rewrite_refusals.items()):
            for reason, nodes in refused.items():
                shown = ", ".join(nodes[:3]) + (", ..." if len(nodes) > 3 else "")
                lines.append(f"{name} refused {len(nodes)} x {reason}: {shown}")
        if self.measured is not None:
            lines += self.measured.format()
        if self.direct_steps:
            lines.append(
                f"steps called directly (no kernel dispatch): {self.direct_steps} of "
                f"{self.steps}, {self.in_place_steps} of them writing into a dead intermediate"
            )
        if self.fusions:
            lines.append("fusions (provider/pass):")
            lines += ["  " + line for f in self.fusions for line in f.format()]
        lines.append("")
        shown = self.nodes if max_nodes is None else self.nodes[:max_nodes]
        for n in shown:
            dom = f"{n.domain}::" if n.domain else ""
            role = f" [{n.role}]" if n.role != "compute" else ""
            lines.append(f"{n.node:40s} {dom}{n.op_type:24s} -> {n.provider}{role}")
            for p, r in n.declined:
                lines.append(f"{'':44s}{p} declined: {r}")
        if max_nodes is not None and len(self.nodes) > max_nodes:
            lines.append(f"... {len(self.nodes) - max_nodes} more nodes")
        for c in self.copies:
            lines.append(f"copy {c.value!r} {c.src} -> {c.dst} (for {c.consumer})")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()
