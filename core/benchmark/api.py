"""The benchmark: sides built, warmed up, run interleaved (A B A B ...), summarized."""

from __future__ import annotations

import json
import platform
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .decode import DecodeState, decode_spec, model_dims
from .sides import OnnxepSide, Side, make_peer, to_numpy
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
    profile_top: list[tuple[str, str, int, float]] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)

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
        if self.tokens and len({tuple(t) for t in self.tokens.values()}) > 1:
            lines.append("note: sides decoded different tokens: " + json.dumps(self.tokens))
        if self.profile_top:
            lines.append("top ops by time (onnxep profile):")
            for op, prov, count, total in self.profile_top:
                lines.append(f"  {op:28s} {prov:6s} {count:6d} calls {total / 1000.0:10.3f} ms")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "mode": self.mode,
            "machine": self.machine,
            "settings": self.settings,
            "sides": self.sides,
            "summary": self.summary,
            "ratios_vs_onnxep": {k: self.ratio(k) for k in self.summary},
            "samples_ms": self.samples,
            "skipped": self.skipped,
            "tokens": self.tokens,
            "profile_top": self.profile_top,
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


class _Progress:
    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.done, self.enabled = total, 0, enabled and sys.stderr.isatty()

    def step(self, label: str) -> None:
        self.done += 1
        if self.enabled:
            width = 30
            filled = int(width * self.done / max(self.total, 1))
            sys.stderr.write(
                f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {label:12s}"
            )
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


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
    """
    model = str(model)
    want_cuda = bool(providers) and any("cuda" in p.lower() for p in providers)
    ours = OnnxepSide(model, providers)
    sides: list[Side] = [ours]
    result = BenchResult(model=model, mode="decode" if decode else "latency")
    for kind in vs:
        try:
            sides.append(make_peer(kind, model, want_cuda))
        except Exception as exc:
            result.skipped[kind] = f"{type(exc).__name__}: {exc}"
    result.machine = machine_info()
    result.settings = {
        "providers": ours.session.get_providers(),
        "vs": list(vs),
        "runs": runs,
        "warmup": warmup,
        "decode": decode,
        "context": context,
        "dims": dict(dims or {}),
    }
    if decode:
        profile_feeds = _decode(result, sides, decode, context, warmup, progress, seed, dims)
    else:
        profile_feeds = _latency(result, sides, runs, warmup, feeds, dims, progress, seed)
    for side in sides:
        if side.name not in result.skipped:
            result.sides.append(side.describe())
            result.summary[side.name] = summarize(result.samples[side.name])
    if profile and profile_feeds is not None:
        # A separate profiled session, so per-step timing never distorts the figures above.
        prof = OnnxepSide(model, providers, profile=True)
        for _ in range(max(3, min(runs, 20))):
            prof.run(profile_feeds)
        assert prof.session.profiler is not None
        result.profile_top = prof.session.profiler.top_ops()
    if json_path:
        Path(json_path).write_text(json.dumps(result.to_json(), indent=1, default=str))
    if plot:
        from .plot import plot_result

        plot_result(result, plot)
    return result


def _latency(result, sides, runs, warmup, feeds, dims, progress, seed) -> None:
    from onnxep.random_inputs import random_inputs

    feeds = dict(feeds) if feeds is not None else random_inputs(sides[0].session, dims, seed=seed)
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
    bar = _Progress(runs * len(live), progress)
    for _ in range(runs):
        for side in live:
            dt, _ = _timed(side, feeds)
            result.samples[side.name].append(dt)
            bar.step(side.name)
    bar.close()
    return feeds


def _decode(result, sides, steps, context, warmup, progress, seed, dims) -> None:
    sess = sides[0].session
    spec = decode_spec(sess.get_inputs(), sess.get_outputs())
    dims = {**model_dims(result.model), **dict(dims or {})}
    names = [o.name for o in sess.get_outputs()]
    states: dict[str, DecodeState] = {}
    live = []
    for side in sides:
        try:
            # warm-up: a short decode of its own, then the measured one from scratch
            warm = DecodeState(spec, context, seed=seed, dims=dims)
            for _ in range(max(warmup, 1)):
                warm.advance(dict(zip(names, to_numpy(side.run(warm.feeds())))))
            st = DecodeState(spec, context, seed=seed, dims=dims)
            st.advance(dict(zip(names, to_numpy(side.run(st.feeds())))))  # prefill
            side.sync()
            states[side.name] = st
            live.append(side)
            result.samples[side.name] = []
        except Exception as exc:
            result.skipped[side.name] = f"{type(exc).__name__}: {str(exc)[:200]}"
    bar = _Progress(steps * len(live), progress)
    for _ in range(steps):
        for side in live:
            st = states[side.name]
            dt, out = _timed(side, st.feeds())
            st.advance(dict(zip(names, to_numpy(out))))
            result.samples[side.name].append(dt)
            bar.step(side.name)
    bar.close()
    result.tokens = {name: st.tokens for name, st in states.items()}
    return states["onnxep"].feeds() if "onnxep" in states else None
