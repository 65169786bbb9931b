"""Which steps of a plan may be recorded in a CUDA graph, the segments, and the policy chosen.

Planned from the plan alone (no GPU), so it is tested on the CPU. Each step
gets a role:

- ``capture``: recorded in a graph (a device kernel that declares itself
  capture-safe, or a copy between device values).
- ``frozen``: a shape-only host step, or a copy of its result: for a fixed
  input-shape key it gives the same values every run, so it runs once while
  the graph is captured and its result is baked in (the cache key holds the
  shapes, so a replay never sees other shapes).
- ``stage``: the upload of a feed to the device. Each replay copies the feed
  into the fixed buffer the graph reads; it depends on the feeds alone, so it
  runs before the graphs and splits no segment.
- ``output``: the trailing copies of graph outputs to the host, run after the
  replay (one device-to-host read per output).
- ``seam``: anything else, run eagerly between graphs, with the reason: host
  compute, a kernel that is not capture-safe (its ``capture_note``), a
  device-to-host read in the middle, an upload of a value the host computes
  each run, a device kernel reading such a host value as a parameter, or a
  step whose capture failed at run time.

Segments are the maximal runs of ``capture``/``frozen`` steps holding at
least one device kernel or copy.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from onnxep.providers.capture import CAPTURE_MODES as MODES

from ..compile.plan import HOST, Plan
from ..errors import ConfigError

#: Ops whose subgraphs run through the host, whatever their kernel declares.
CONTROL_FLOW = frozenset({"If", "Loop", "Scan", "SequenceMap"})


@dataclass(frozen=True)
class StepRole:
    index: int
    name: str
    op_type: str
    role: str  # capture | frozen | stage | output | seam
    reason: str = ""


@dataclass(frozen=True)
class Segment:
    """Steps ``start`` to ``stop - 1`` of the plan, recorded as one graph."""

    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass
class CapturePlan:
    """The policy chosen for a plan: ``mode`` is ``off``, ``whole`` or ``segmented``."""

    requested: str
    mode: str
    reason: str
    roles: list[StepRole] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)

    @property
    def seams(self) -> list[StepRole]:
        return [r for r in self.roles if r.role == "seam"]

    def to_dict(self) -> dict:
        return {
            "requested": self.requested,
            "mode": self.mode,
            "reason": self.reason,
            "segments": [[s.start, s.stop] for s in self.segments],
            "seams": [
                {"step": r.name, "op_type": r.op_type, "reason": r.reason} for r in self.seams
            ],
        }

    def format(self) -> str:
        lines = [f"capture: {self.mode} (asked: {self.requested}) - {self.reason}"]
        if self.mode == "off":
            return "\n".join(lines)
        seam_at = {r.index: r for r in self.seams}
        nxt = 0
        for k, seg in enumerate(self.segments):
            for i in range(nxt, seg.start):
                if i in seam_at:
                    r = seam_at[i]
                    lines.append(f"  seam {r.name!r} ({r.op_type}): {r.reason}")
            lines.append(f"  graph {k}: steps {seg.start}..{seg.stop - 1} ({len(seg)} steps)")
            nxt = seg.stop
        for i in range(nxt, len(self.roles)):
            if i in seam_at:
                r = seam_at[i]
                lines.append(f"  seam {r.name!r} ({r.op_type}): {r.reason}")
        return "\n".join(lines)


class CaptureRefused(ConfigError):
    """``capture="whole"`` was asked for a plan that cannot be one graph."""


def check_mode(mode: str, where: str = "capture") -> str:
    low = str(mode).strip().lower()
    if low not in MODES:
        raise ConfigError(f"{where} must be one of {', '.join(MODES)}, got {mode!r}")
    return low


def step_roles(
    plan: Plan, capturing: Collection[str], forced: Mapping[int, str] | None = None
) -> list[StepRole]:
    """Each step's role. ``capturing`` holds the names and devices of capturing providers;
    ``forced`` maps step indexes to the reason they must be seams (a failed capture)."""
    forced = forced or {}
    inputs = set(plan.input_slots)
    dynamic_host = set(inputs)  # host values that may change between runs with one shape key
    device_slots: set[int] = set()
    static = {s for s, v in enumerate(plan.template) if v is not None}
    out_start = len(plan.steps) - plan.output_copies
    roles: list[StepRole] = []
    for i, step in enumerate(plan.steps):
        role, reason = _role(
            step, i, capturing, dynamic_host, device_slots, static, inputs, out_start
        )
        if i in forced and role in ("capture", "frozen"):
            role, reason = "seam", forced[i]
        on_device = step.provider in capturing and step.provider != HOST
        for s in step.outputs:
            if on_device:
                device_slots.add(s)
            elif role != "frozen":
                dynamic_host.add(s)
        roles.append(StepRole(i, step.name, step.op_type, role, reason))
    return roles


def _role(
    step, i, capturing, dynamic_host, device_slots, static, inputs, out_start
) -> tuple[str, str]:
    on_device = step.provider in capturing and step.provider != HOST
    if step.kind == "copy":
        src = step.inputs[0]
        if i >= out_start:
            return "output", ""
        if step.shape_only:
            return "frozen", ""
        if not on_device:
            if src in device_slots:
                return "seam", "reads a device value back to the host (a host-memory input)"
            if src in dynamic_host:
                return "seam", f"a copy on a provider that does not capture ({step.provider!r})"
            return "frozen", ""
        if src in inputs:
            return "stage", ""
        # A host value that is neither a feed, nor shape math, nor a constant is computed on
        # each run, also where a device step (control flow) handed it over on the host.
        if src in dynamic_host or (step.source == HOST and src not in static):
            return "seam", "uploads a value the host computes on each run"
        return "capture", ""
    if not on_device:
        if step.shape_only:
            return "frozen", ""
        return "seam", f"runs on the host (provider {step.provider!r})"
    if step.op_type in CONTROL_FLOW:
        return "seam", step.capture_note or "control flow runs through the host"
    if not step.capture_safe:
        return "seam", step.capture_note or "its kernel is not capture-safe"
    for s in step.inputs:
        if s in dynamic_host:
            return "seam", "reads a host value that can change from run to run as a parameter"
    return "capture", ""


def segments_of(roles: Sequence[StepRole]) -> list[Segment]:
    """Maximal runs of capture/frozen steps (stage steps do not split them), with a
    device step in each."""
    out: list[Segment] = []
    start = None
    has_device = False
    for r in [*roles, StepRole(len(roles), "", "", "seam")]:
        if r.role in ("capture", "frozen", "stage"):
            if start is None and r.role != "stage":
                start, has_device = r.index, False
            has_device = has_device or r.role == "capture"
            continue
        if start is not None and has_device:
            stop = r.index
            while roles[stop - 1].role == "stage":
                stop -= 1
            out.append(Segment(start, stop))
        start = None
    return out


def plan_capture(
    plan: Plan,
    capturing: Collection[str],
    requested: str = "auto",
    forced: Mapping[int, str] | None = None,
) -> CapturePlan:
    """Choose the policy for ``plan`` (see the module doc); ``whole`` that cannot be
    raises :class:`CaptureRefused` naming every seam and why."""
    requested = check_mode(requested)
    roles = step_roles(plan, capturing, forced)
    if requested == "off":
        return CapturePlan(requested, "off", "capture is switched off", roles)
    segs = segments_of(roles)
    seams = [r for r in roles if r.role == "seam"]
    if not segs:
        why = "no step runs on a capturing provider"
        if seams:
            why = f"no capture-safe run of device steps ({len(seams)} seam(s))"
        if requested == "whole":
            raise CaptureRefused(f"capture='whole' is not possible: {why}")
        return CapturePlan(requested, "off", why, roles)
    if not seams:
        return CapturePlan(requested, "whole", "every step is capture-safe", roles, segs)
    if requested == "whole":
        listed = "; ".join(f"{r.name!r} ({r.op_type}): {r.reason}" for r in seams)
        raise CaptureRefused(
            f"capture='whole' is not possible: {len(seams)} step(s) cannot be captured: "
            f"{listed}. Use capture='segmented' or 'auto' to capture the runs between them"
        )
    why = (
        f"{len(seams)} step(s) cannot be captured (first: {seams[0].name!r}: "
        f"{seams[0].reason}); {len(segs)} graph(s) between them"
    )
    return CapturePlan(requested, "segmented", why, roles, segs)
