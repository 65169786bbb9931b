"""What the CPU comparison scripts share (cpu_profile_decode.py, cpu_profile_vs_ort.py,
cpu_profile_by_kind.py, cpu_nbits_ab.py, node_floor.py, cpu_recurrent.py): onnxruntime
sessions that log nothing, two sessions timed run by run in turn, each side's per-node
kernel times from its own profiler, and the per-op-type table.

Kernel times per op type are the sum of each node's median over the runs, not of means:
on a shared machine one descheduled run makes a node's mean tens of times its usual time
(nudenet's nine Splits, views of 22 us each, read 3.4 ms summed as means of 40 runs).
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: (node name, op type, microseconds) of one executed node
Event = tuple[str, str, float]


def ort_session(path: str | Path, threads: int = 0, spin: bool = True, profile_dir=None) -> Any:
    """An onnxruntime CPU session that logs nothing: ``threads`` intra-op threads (0 its
    default), its pool threads spinning between runs unless ``spin`` is off, profiling
    into ``profile_dir`` when given."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 4
    if not spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile_dir is not None:
        so.enable_profiling = True
        so.profile_file_prefix = str(Path(profile_dir) / "ort")
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def alternating_medians(
    ours: Any, theirs: Any, feeds: dict, runs: int, warmup: int = 10
) -> tuple[float, float]:
    """Median seconds a run of ``ours`` and of ``theirs`` (two sessions with ``run(None,
    feeds)``), after ``warmup`` runs each, their runs alternating so that a busy moment of a
    shared machine falls on both sides alike."""
    for _ in range(warmup):
        ours.run(None, feeds)
        theirs.run(None, feeds)
    a, b = [], []
    for _ in range(runs):
        t0 = time.perf_counter()
        ours.run(None, feeds)
        t1 = time.perf_counter()
        theirs.run(None, feeds)
        t2 = time.perf_counter()
        a.append(t1 - t0)
        b.append(t2 - t1)
    return statistics.median(a), statistics.median(b)


def profiled_session(path: str | Path, threads: int = 0) -> Any:
    """An onnxep CPU session with its profiler on, ``threads`` intra-op threads."""
    import onnxep

    so = onnxep.SessionOptions(intra_op_num_threads=threads, enable_profiling=True)
    return onnxep.InferenceSession(str(path), so, providers=["cpu"])


def node_events(sess: Any, feeds: dict, runs: int) -> list[Event]:
    """Each node run of ``runs`` runs of the profiled onnxep session ``sess``, after five
    unrecorded ones."""
    for _ in range(5):
        sess.run(None, feeds)
    sess.profiler._events.clear()  # noqa: SLF001  (bench tool: drop the warm-up runs)
    for _ in range(runs):
        sess.run(None, feeds)
    return [
        (e["name"], e["args"].get("op_type", "?"), float(e["dur"]))
        for e in sess.profiler.events
        if e.get("cat") == "Node"
    ]


def onnxep_events(path: str | Path, feeds: dict, runs: int, threads: int = 0) -> list[Event]:
    """:func:`node_events` of a fresh profiled session on ``path``."""
    return node_events(profiled_session(path, threads), feeds, runs)


def ort_kernel_trace(path: str | Path, feeds: dict, runs: int, threads: int = 0) -> list[dict]:
    """onnxruntime's profiler events for each node's kernel over ``runs`` runs (pool
    threads not spinning): ``name``, ``dur`` (us) and ``args`` (``op_name``,
    ``input_type_shape``, ...)."""
    with tempfile.TemporaryDirectory() as tmp:
        sess = ort_session(path, threads, spin=False, profile_dir=tmp)
        for _ in range(runs):
            sess.run(None, feeds)
        trace = json.loads(Path(sess.end_profiling()).read_text())
    return [
        e
        for e in trace
        if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")
    ]


def ort_events(path: str | Path, feeds: dict, runs: int, threads: int = 0) -> list[Event]:
    """Each node's kernel time over ``runs`` profiled onnxruntime runs."""
    return [
        (e["name"], e["args"].get("op_name", "?"), float(e["dur"]))
        for e in ort_kernel_trace(path, feeds, runs, threads)
    ]


def node_medians(events: Iterable[Event]) -> dict[str, tuple[str, float]]:
    """Node name -> (op type, its median microseconds)."""
    per: dict[str, list[float]] = defaultdict(list)
    op_of: dict[str, str] = {}
    for name, op, us in events:
        per[name].append(us)
        op_of[name] = op
    return {n: (op_of[n], statistics.median(v)) for n, v in per.items()}


def by_op(events: Iterable[Event]) -> dict[str, tuple[int, float]]:
    """Op type -> (nodes, the sum of their medians)."""
    out: dict[str, tuple[int, float]] = {}
    for op, t in node_medians(events).values():
        n, total = out.get(op, (0, 0.0))
        out[op] = (n + 1, total + t)
    return out


def print_by_op(mine: dict, theirs: dict, top: int) -> None:
    """The ``top`` op types by the larger of the two sides' times, onnxep's then
    onnxruntime's node counts and microseconds."""
    ops = sorted(
        set(mine) | set(theirs),
        key=lambda o: -max(mine.get(o, (0, 0))[1], theirs.get(o, (0, 0))[1]),
    )
    print(f"{'op type':36s} {'n':>4s} {'onnxep us':>10s} {'n':>4s} {'ort us':>9s}")
    for op in ops[:top]:
        n1, t1 = mine.get(op, (0, 0.0))
        n2, t2 = theirs.get(op, (0, 0.0))
        print(f"{op:36s} {n1:4d} {t1:10.1f} {n2:4d} {t2:9.1f}")
