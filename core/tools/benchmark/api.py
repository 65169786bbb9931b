"""The benchmark: sides built, warmed up, run interleaved (A B A B ...), summarized."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...generation.spec import DecodeState, decode_spec, model_dims
from ...progress import progress_bar
from .loops import OnnxepLoop
from .sides import GRAPH_SIDE, OnnxepSide, Side, make_peer, with_capture
from .stats import summarize


@dataclass
class BenchResult:
    model: str
    mode: str  # "latency" or "decode"
    sides: list[dict[str, Any]] = field(default_factory=list)
    samples: dict[str, list[float]] = field(default_factory=dict)
    summary: dict[str, dict[str, float]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    tokens: dict[str, list[int]] = field(default_factory=dict)
    #: decode mode, per side: per-step records besides the timed ms (onnxep: host ms of the
    #: run call, device-to-host reads, host-to-device copies, outputs copied into buffers)
    per_step: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    profile_top: list[tuple[str, str, int, float]] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    #: the model's initializer bytes: a decode step's bandwidth floor reads them once
    weight_bytes: int | None = None
    #: decode mode: ms per step of each side decoding alone, its steps back to back with one
    #: sync at the end (as ``onnxep.generate`` runs: the next step queued before a token is
    #: read), where the interleaved samples sync after every step
    sustained: dict[str, float] = field(default_factory=dict)

    def ratio(self, side: str) -> float:
        """``side``'s median over onnxep's: above 1 means onnxep is faster."""
        return self.summary[side]["median_ms"] / self.summary["onnxep"]["median_ms"]

    def table(self) -> str:
        head = f"{'side':18s} {'median ms':>10s} {'p90 ms':>10s}"
        if self.mode == "decode":
            head += f" {'tok/s':>9s}"
        head += f" {'vs onnxep':>10s}"
        lines = [f"model: {self.model} ({self.mode})", head]
        for name, s in self.summary.items():
            row = f"{name:18s} {s['median_ms']:10.3f} {s['p90_ms']:10.3f}"
            if self.mode == "decode":
                row += f" {1000.0 / s['median_ms']:9.1f}"
            row += f" {self.ratio(name):9.2f}x"
            lines.append(row)
        for name, why in self.skipped.items():
            lines.append(f"{name:18s} skipped: {why}")
        ours = next((s for s in self.sides if s["name"] == "onnxep"), None)
        if ours:
            lines.append(
                f"onnxep placement: {ours.get('nodes_per_provider')}, copies {ours.get('copies')}"
                f" (device-to-host {ours.get('device_to_host_copies')}, measured reads per run"
                f" {ours.get('device_to_host_reads_per_run')}),"
                f" fallbacks {ours.get('fallbacks')}"
            )
        if ours and self.mode == "decode" and "state_path" in ours:
            lines.append(
                f"onnxep decode: state {ours['state_path']} ({ours['state_note']}), capacity "
                f"{ours['capacity']}; per step: device-to-host reads "
                f"{ours['device_to_host_reads_per_step']}, host-to-device copies "
                f"{ours['host_to_device_copies_per_step']}, outputs copied "
                f"{ours['copied_outputs_per_step']}; host {ours['host_us_per_op']:.1f} us/op "
                f"over {ours['compute_nodes']} compute nodes (run call, executor included)"
                + (
                    f", profiled {ours['profiled_us_per_op']:.1f} us/op"
                    if "profiled_us_per_op" in ours
                    else ""
                )
            )
        for side in self.sides:
            c = side.get("capture_timed")
            if self.mode == "decode" and c is not None:
                lines.append(
                    f"{side['name']} capture: {c['policy']}, timed decode: captures "
                    f"{c['captures']}, replays {c['replays']}, fallbacks {c['fallbacks']}"
                    + (f" ({'; '.join(c['failures'])[:300]})" if c["failures"] else "")
                )
        on_cuda = any("cuda" in str(p).lower() for p in self.settings.get("providers", []))
        if self.mode == "decode" and self.weight_bytes and on_cuda:
            from .decode_report import floor_line

            lines.append(floor_line(self.to_json()).strip() + " (H200 copy bandwidth)")
        if self.sustained:
            alone = ", ".join(
                f"{k} {v:.3f} ms/step ({1000.0 / v:.1f} tok/s)" for k, v in self.sustained.items()
            )
            lines.append(f"back to back (each side alone, one sync at the end): {alone}")
        lines += self._token_lines()
        if self.profile_top:
            lines.append("top ops by time (onnxep profile):")
            for op, prov, count, total in self.profile_top:
                lines.append(f"  {op:28s} {prov:6s} {count:6d} calls {total / 1000.0:10.3f} ms")
        return "\n".join(lines)

    def _token_lines(self) -> list[str]:
        """Each side's greedy tokens against onnxep's."""
        ref = self.tokens.get("onnxep")
        if not ref:
            return []
        lines = []
        for name, toks in self.tokens.items():
            if name == "onnxep":
                continue
            same = sum(1 for a, b in zip(ref, toks) if a == b)
            first = next((i for i, (a, b) in enumerate(zip(ref, toks)) if a != b), None)
            where = "" if first is None else f", first difference at token {first}"
            lines.append(f"tokens: {name} equals onnxep at {same}/{len(ref)}{where}")
        if any(t != ref for t in self.tokens.values()):
            lines.append("note: sides decoded different tokens: " + json.dumps(self.tokens))
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "mode": self.mode,
            "machine": self.machine,
            "settings": self.settings,
            "weight_bytes": self.weight_bytes,
            "sides": self.sides,
            "summary": self.summary,
            "ratios_vs_onnxep": {k: self.ratio(k) for k in self.summary},
            "samples_ms": self.samples,
            "skipped": self.skipped,
            "tokens": self.tokens,
            "per_step": self.per_step,
            "profile_top": self.profile_top,
            "sustained_ms_per_step": self.sustained,
        }


def machine_info() -> dict[str, Any]:
    import os

    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "numpy": np.__version__,
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    for mod in ("onnx", "onnxruntime", "torch", "cupy"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:
            pass
    try:
        import cupy

        info["gpu"] = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except Exception:
        pass
    return info


def _timed(side: Side, feeds: Mapping[str, Any]) -> tuple[float, list[Any]]:
    t0 = time.perf_counter()
    out = side.run(feeds)
    side.sync()
    return (time.perf_counter() - t0) * 1000.0, out


def bench(
    model: str,
    providers: Sequence[str] | None = None,
    vs: Sequence[str] = ("onnxruntime",),
    runs: int = 50,
    warmup: int = 5,
    decode: int | None = None,
    context: int = 16,
    feeds: Mapping[str, Any] | None = None,
    dims: Mapping[str, int] | None = None,
    shapes: Mapping[str, Sequence[int]] | None = None,
    int_ranges: Mapping[str, tuple[int, int]] | None = None,
    profile: bool = False,
    json_path: str | None = None,
    plot: str | None = None,
    progress: bool = True,
    seed: int = 0,
) -> BenchResult:
    """Time onnxep against each peer in ``vs`` on the same inputs, interleaved.

    Latency mode runs the model ``runs`` times per side on one set of feeds
    (random from the declared inputs unless given). Decode mode (``decode``
    steps after a ``context``-token prefill) drives the model greedily with
    its KV cache and times each decode step.

    ``"onnxep-graph"`` in ``vs`` adds a second onnxep side whose CUDA
    provider captures CUDA graphs (``capture="auto"``); onnxep's own side
    then runs with capture off, so one run gives the eager and the captured
    figure (``$ONNXEP_CUDA_CAPTURE``, when set, overrides both; the settings
    record it).
    """
    model = str(model)
    want_cuda = bool(providers) and any("cuda" in p.lower() for p in providers)
    graph = GRAPH_SIDE in vs
    ours = OnnxepSide(model, with_capture(providers, "off") if graph and want_cuda else providers)
    sides: list[Side] = [ours]
    result = BenchResult(model=model, mode="decode" if decode else "latency")
    for kind in vs:
        if kind == GRAPH_SIDE:
            if not want_cuda:
                result.skipped[kind] = "needs a CUDA provider in --providers (CUDA graphs)"
                continue
            try:
                sides.append(OnnxepSide(model, with_capture(providers, "auto"), name=GRAPH_SIDE))
            except Exception as exc:
                result.skipped[kind] = f"{type(exc).__name__}: {exc}"
            continue
        try:
            sides.append(make_peer(kind, model, want_cuda, sides))
        except Exception as exc:
            result.skipped[kind] = f"{type(exc).__name__}: {exc}"
    result.machine = machine_info()
    # imported here: ``python -m onnxep.tools.benchmark.decode_report`` must find it unimported
    from .decode_report import weight_bytes

    result.weight_bytes = weight_bytes(model)
    result.settings = {
        "providers": ours.session.get_providers(),
        "vs": list(vs),
        "runs": runs,
        "warmup": warmup,
        "decode": decode,
        "context": context,
        "dims": dict(dims or {}),
        "capture_env": os.environ.get("ONNXEP_CUDA_CAPTURE", ""),
    }
    if decode:
        profile_feeds = _decode(result, sides, decode, context, warmup, progress, seed, dims)
    else:
        made = {"dims": dims, "shapes": shapes, "int_ranges": int_ranges}
        profile_feeds = _latency(result, sides, runs, warmup, feeds, made, progress, seed)
    for side in sides:
        if side.name not in result.skipped:
            result.sides.append(side.describe())
            result.summary[side.name] = summarize(result.samples[side.name])
    if profile and profile_feeds is not None:
        # A separate profiled session, so per-step timing never distorts the figures above.
        prof = OnnxepSide(model, providers, profile=True)
        repeats = max(3, min(runs, 20))
        for _ in range(repeats):
            prof.run(profile_feeds)
        assert prof.session.profiler is not None
        result.profile_top = prof.session.profiler.top_ops()
        every = prof.session.profiler.top_ops(n=1 << 30)
        calls = sum(r[2] for r in every)
        if calls and result.sides and result.sides[0]["name"] == "onnxep":
            # each node timed after a synchronize: host and device time of a node, copies included
            result.sides[0]["profiled_us_per_op"] = sum(r[3] for r in every) / calls
    if json_path:
        Path(json_path).write_text(json.dumps(result.to_json(), indent=1, default=str))
    if plot:
        from .plot import plot_result

        plot_result(result, plot)
    return result


def _latency(result, sides, runs, warmup, feeds, made, progress, seed) -> None:
    """``feeds`` given are used as they are; the model's other inputs are made as ``made``
    (dims, shapes, int_ranges) says."""
    from onnxep.tools.random_inputs import random_inputs

    feeds = random_inputs(
        sides[0].session,
        made["dims"],
        seed=seed,
        shapes=made["shapes"],
        int_ranges=made["int_ranges"],
        given=feeds,
    )
    live = []
    for side in sides:
        try:
            for _ in range(max(warmup, 1)):
                side.run(feeds)
            side.sync()
            live.append(side)
            result.samples[side.name] = []
        except Exception as exc:
            result.skipped[side.name] = f"{type(exc).__name__}: {str(exc)[:200]}"
    bar = _bar(runs * len(live), progress, "bench")
    for _ in range(runs):
        for side in live:
            dt, _ = _timed(side, feeds)
            result.samples[side.name].append(dt)
            bar.set_postfix_str(side.name, refresh=False)
            bar.update(1)
    bar.close()
    return feeds


def _bar(total: int, progress: bool, desc: str) -> Any:
    """The bench's bar: shown on a terminal unless ``progress`` is off."""
    return progress_bar(total, None if progress else False, desc, min_total=0)


def _decode(result, sides, steps, context, warmup, progress, seed, dims) -> Any:
    """``steps`` timed decode steps after the prefill, each side with its own greedy loop.

    Every side starts from the same prompt and decodes ``steps + 1`` tokens;
    a warm-up decode of its own comes first. Steps are interleaved across
    sides, and each is timed up to its token being on the host.
    """
    sess = sides[0].session
    spec = decode_spec(sess.get_inputs(), sess.get_outputs())
    dims = {**model_dims(result.model), **dict(dims or {})}
    names = [o.name for o in sess.get_outputs()]
    prompt = DecodeState(spec, context, seed=seed, dims=dims).ids
    loops: dict[str, Any] = {}
    live = []
    # one capacity for the warm-up and the timed decode: the same step shapes, so a
    # capturing side captures while warming up and only replays while timed
    capacity = prompt.shape[1] + max(steps + 1 + BACK_TO_BACK_UNTIMED, max(warmup, 1) + 1)
    for side in sides:
        side.decode_capacity = capacity
        try:
            warm = side.decode_loop(spec, prompt, max(warmup, 1) + 1, dims, names)
            while not warm.done:
                warm.step()
            loop = side.decode_loop(spec, prompt, steps + 1, dims, names)
            loop.step()  # the prefill, untimed
            side.sync()
            loops[side.name] = side.timed_loop = loop
            live.append(side)
            result.samples[side.name] = []
        except Exception as exc:
            result.skipped[side.name] = f"{type(exc).__name__}: {str(exc)[:200]}"
    bar = _bar(steps * len(live), progress, "decode")
    for _ in range(steps):
        for side in live:
            loop = loops[side.name]
            t0 = time.perf_counter()
            loop.step()
            side.sync()
            result.samples[side.name].append((time.perf_counter() - t0) * 1000.0)
            bar.set_postfix_str(side.name, refresh=False)
            bar.update(1)
    bar.close()
    result.tokens = {name: list(loop.tokens) for name, loop in loops.items()}
    for side in live:
        _back_to_back(result, side, spec, prompt, steps, dims, names)
    for side in sides:
        loop = loops.get(side.name)
        if isinstance(side, OnnxepSide) and isinstance(loop, OnnxepLoop):
            side.decode_info = _record_onnxep_steps(result, side.name, loop)
    ours = loops.get("onnxep")
    return ours.decoder.host_feeds() if isinstance(ours, OnnxepLoop) else None


#: Decode steps a back-to-back run leaves untimed after its prefill.
BACK_TO_BACK_UNTIMED = 2


def _back_to_back(result, side, spec, prompt, steps, dims, names) -> None:
    """``steps`` decode steps of ``side`` alone, synced once at the end: what a decode loop
    sustains when nothing waits between its steps. The prefill and two decode steps before
    them are untimed (a capturing side captures a new loop's graph at its first step)."""
    untimed = BACK_TO_BACK_UNTIMED
    try:
        if isinstance(side, OnnxepSide):  # as onnxep.generate runs
            loop = side.decode_loop(spec, prompt, steps + 1 + untimed, dims, names, pipeline=True)
        else:
            loop = side.decode_loop(spec, prompt, steps + 1 + untimed, dims, names)
        for _ in range(1 + untimed):
            loop.step()
        side.sync()
        t0 = time.perf_counter()
        while not loop.done:
            loop.step()
        side.sync()
        result.sustained[side.name] = (time.perf_counter() - t0) * 1000.0 / steps
    except Exception as exc:
        result.skipped[f"{side.name} back to back"] = f"{type(exc).__name__}: {str(exc)[:200]}"


def _record_onnxep_steps(result: BenchResult, name: str, loop: OnnxepLoop) -> dict[str, Any]:
    """An onnxep side's per-step counters (the prefill left out) and how it kept the state."""
    r = loop.decoder.finish()
    steps = {
        "host_ms": r.host_ms[1:],
        "copied_outputs": r.copied_outputs[1:],
    }
    if r.device_to_host_reads is not None and r.host_to_device_copies is not None:
        steps["device_to_host_reads"] = r.device_to_host_reads[1:]
        steps["host_to_device_copies"] = r.host_to_device_copies[1:]
    result.per_step[name] = steps

    def most(key: str) -> int | None:
        values = steps.get(key)
        return max(values) if values else None

    return {
        "state_path": r.state_path,
        "state_note": r.state_note,
        "capacity": r.capacity,
        "compute_nodes": r.compute_nodes,
        "host_us_per_op": r.host_us_per_op,
        "device_to_host_reads_per_step": most("device_to_host_reads"),
        "host_to_device_copies_per_step": most("host_to_device_copies"),
        "copied_outputs_per_step": most("copied_outputs"),
        "full_mask": r.full_mask,
        #: the session's capture counters over the timed decode (prefill included)
        "capture_timed": r.capture_stats,
    }
