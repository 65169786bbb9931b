"""Where a corpus model's time goes, per op type, on onnxep's CPU provider and onnxruntime's.

    python bench/cpu_profile_vs_ort.py MODEL [MODEL ...] [--runs 50] [--threads 1] [--top 15]

Each side runs the model ``--runs`` times after warm-up with its own profiler on
(onnxep's ``enable_profiling``, onnxruntime's ``enable_profiling``), in this one
process, on identical feeds; the table gives each op type's kernel time per run (the
sum of its nodes' medians over the runs), its node count and the ratio. Node names are
not matched across the two: onnxruntime fuses and renames (its NCHWc layout, FusedConv,
QuickGelu), so compare op types and totals. Per-node overhead outside the kernels shows
as the gap between the kernels' sum and the wall time per run, printed for both sides.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


def _by_op(events: list[tuple[str, str, float]]) -> dict[str, tuple[int, float]]:
    """(node name, op type, us) per executed node -> op type: (nodes, the sum of each
    node's median). Medians, not means: on a shared machine one descheduled run makes a
    node's mean tens of times its usual time (nudenet's nine Splits, views of 22 us each,
    read 3.4 ms summed as means of 40 runs)."""
    per_node: dict[str, list[float]] = defaultdict(list)
    op_of: dict[str, str] = {}
    for name, op, us in events:
        per_node[name].append(us)
        op_of[name] = op
    out: dict[str, tuple[int, float]] = {}
    for name, d in per_node.items():
        n, t = out.get(op_of[name], (0, 0.0))
        out[op_of[name]] = (n + 1, t + statistics.median(d))
    return out


def _ort_by_op(trace: Path) -> dict[str, tuple[int, float]]:
    return _by_op(
        [
            (e["name"], e["args"].get("op_name", "?"), float(e["dur"]))
            for e in json.loads(trace.read_text())
            if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")
        ]
    )


def _ours_by_op(events: list[dict]) -> dict[str, tuple[int, float]]:
    return _by_op(
        [
            (e["name"], e["args"].get("op_type", "?"), float(e["dur"]))
            for e in events
            if e["cat"] == "Node"
        ]
    )


def profile(name: str, runs: int, threads: int, top: int) -> None:
    import onnx
    import onnxruntime as ort
    from real_models import CORPUS, feeds, fetch

    import onnxep

    model = next(m for m in CORPUS if m.name == name)
    path = fetch(model)
    inputs = feeds(model, onnx.load(str(path), load_external_data=False))

    ours = onnxep.InferenceSession(
        str(path), onnxep.SessionOptions(intra_op_num_threads=threads), providers=["cpu"]
    )
    for _ in range(5):
        ours.run(None, inputs)
    t0 = time.perf_counter()
    for _ in range(runs):
        ours.run(None, inputs)
    ours_wall = (time.perf_counter() - t0) / runs * 1e6
    so = onnxep.SessionOptions(intra_op_num_threads=threads, enable_profiling=True)
    prof = onnxep.InferenceSession(str(path), so, providers=["cpu"])
    for _ in range(5):
        prof.run(None, inputs)
    prof.profiler._events.clear()  # noqa: SLF001  (bench tool: drop the warm-up runs)
    for _ in range(runs):
        prof.run(None, inputs)
    mine = _ours_by_op(prof.profiler.events)

    with tempfile.TemporaryDirectory() as tmp:
        oso = ort.SessionOptions()
        oso.intra_op_num_threads = threads
        oso.log_severity_level = 4
        oso.add_session_config_entry("session.intra_op.allow_spinning", "0")
        plain = ort.InferenceSession(str(path), oso, providers=["CPUExecutionProvider"])
        for _ in range(5):
            plain.run(None, inputs)
        t0 = time.perf_counter()
        for _ in range(runs):
            plain.run(None, inputs)
        ort_wall = (time.perf_counter() - t0) / runs * 1e6
        oso.enable_profiling = True
        oso.profile_file_prefix = str(Path(tmp) / "ort")
        theirs = ort.InferenceSession(str(path), oso, providers=["CPUExecutionProvider"])
        for _ in range(runs):
            theirs.run(None, inputs)
        theirs_by = _ort_by_op(Path(theirs.end_profiling()))

    ours_sum = sum(t for _, t in mine.values())
    ort_sum = sum(t for _, t in theirs_by.values())
    print(
        f"\n== {name}: wall per run onnxep {ours_wall:.0f} us, onnxruntime {ort_wall:.0f} us "
        f"({ours_wall / ort_wall:.2f}x); kernels onnxep {ours_sum:.0f} us, "
        f"onnxruntime {ort_sum:.0f} us"
    )
    ops = sorted(
        set(mine) | set(theirs_by),
        key=lambda o: -max(mine.get(o, (0, 0))[1], theirs_by.get(o, (0, 0))[1]),
    )
    print(f"{'op type':34s} {'n':>4s} {'onnxep us':>10s} {'n':>4s} {'ort us':>9s}")
    for op in ops[:top]:
        n1, t1 = mine.get(op, (0, 0.0))
        n2, t2 = theirs_by.get(op, (0, 0.0))
        print(f"{op:34s} {n1:4d} {t1:10.1f} {n2:4d} {t2:9.1f}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args(argv)
    for name in a.models:
        profile(name, a.runs, a.threads, a.top)


if __name__ == "__main__":
    main()
