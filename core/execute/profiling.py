"""Per-step profiling: Chrome-trace JSON with one event per executed step.

Enabled by ``SessionOptions.enable_profiling``; ``InferenceSession.end_profiling()``
writes the trace (it opens in Perfetto or chrome://tracing) and returns its path.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import defaultdict
from typing import Any


class Profiler:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.start_ns = time.perf_counter_ns()
        self.wall_start = time.time()
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def now_us(self) -> float:
        return (time.perf_counter_ns() - self.start_ns) / 1000.0

    def record(self, name: str, cat: str, start_us: float, dur_us: float, **args: Any) -> None:
        ev = {
            "name": name,
            "cat": cat,
            "ph": "X",
            "ts": start_us,
            "dur": dur_us,
            "pid": os.getpid(),
            "tid": threading.get_ident() % 100000,
            "args": args,
        }
        with self._lock:
            self._events.append(ev)

    @property
    def events(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._events)

    def top_ops(self, n: int = 15) -> list[tuple[str, str, int, float]]:
        """``(op_type, provider, count, total_us)`` for the most expensive ops."""
        agg: dict[tuple[str, str], list[float]] = defaultdict(list)
        for e in self.events:
            if e["cat"] == "Node":
                agg[(e["args"].get("op_type", "?"), e["args"].get("provider", "?"))].append(
                    e["dur"]
                )
        rows = [(op, prov, len(d), sum(d)) for (op, prov), d in agg.items()]
        rows.sort(key=lambda r: -r[3])
        return rows[:n]

    def device_to_host_reads(self) -> int:
        """Device-to-host copy steps recorded so far (copies whose destination is the host)."""
        return sum(
            1
            for e in self.events
            if e["cat"] == "Node"
            and e["args"].get("kind") == "copy"
            and e["args"].get("provider") == "cpu"
        )

    def write(self, path: str | None = None) -> str:
        if path is None:
            stamp = time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(self.wall_start))
            path = f"{self.prefix}_{stamp}.json"
        with open(path, "w") as f:
            json.dump({"traceEvents": self.events, "displayTimeUnit": "ms"}, f)
        return path
