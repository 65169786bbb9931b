"""Where a decode step's time goes, per node and op type, onnxep's CPU provider against
onnxruntime's, on one set of decode-shaped feeds (one new token over ``--past`` cached ones).

    python bench/cpu_profile_decode.py MODEL [--past 16] [--runs 200] [--top 25] [--nodes 0]

Both sides use their own profiler in this one process; the table is the sum, per op type,
of each node's median over the runs. ``--nodes N`` also lists onnxep's N slowest nodes.
The wall figures come from unprofiled sessions timed alternately on the same feeds.
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def decode_feeds(path: str, past: int) -> dict:
    import onnxep
    from onnxep.tools.random_inputs import random_inputs

    sess = onnxep.InferenceSession(path, providers=["cpu"])
    dims = {
        "batch_size": 1,
        "batch": 1,
        "sequence_length": 1,
        "seq": 1,
        "past_sequence_length": past,
        "past": past,
        "total_sequence_length": past + 1,
    }
    feeds = random_inputs(sess, dims, int_ranges={"input_ids": (0, 32)})
    for name, x in feeds.items():
        if "mask" in name:
            feeds[name] = np.ones_like(x)
        if "position" in name:
            feeds[name] = np.full_like(x, past)
    return feeds


def medians(events) -> tuple[dict, dict]:
    per: dict[str, list[float]] = defaultdict(list)
    op_of: dict[str, str] = {}
    for name, op, us in events:
        per[name].append(us)
        op_of[name] = op
    node = {n: statistics.median(v) for n, v in per.items()}
    by_op: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for n, t in node.items():
        by_op[op_of[n]][0] += 1
        by_op[op_of[n]][1] += t
    return by_op, {n: (op_of[n], t) for n, t in node.items()}


def main() -> None:
    import onnxruntime as ort

    import onnxep

    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--past", type=int, default=16)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--nodes", type=int, default=0)
    a = ap.parse_args()
    feeds = decode_feeds(a.model, a.past)
    ours = onnxep.InferenceSession(a.model, providers=["cpu"])
    oso = ort.SessionOptions()
    oso.log_severity_level = 4
    oso.add_session_config_entry("session.intra_op.allow_spinning", "0")
    plain = ort.InferenceSession(a.model, oso, providers=["CPUExecutionProvider"])
    walls: dict[str, list[float]] = {"onnxep": [], "ort": []}
    for _ in range(5):
        ours.run(None, feeds)
        plain.run(None, feeds)
    for _ in range(a.runs):
        for k, s in (("onnxep", ours), ("ort", plain)):
            t0 = time.perf_counter()
            s.run(None, feeds)
            walls[k].append((time.perf_counter() - t0) * 1e6)
    w1, w2 = (statistics.median(walls[k]) for k in ("onnxep", "ort"))

    prof = onnxep.InferenceSession(
        a.model, onnxep.SessionOptions(enable_profiling=True), providers=["cpu"]
    )
    for _ in range(5):
        prof.run(None, feeds)
    prof.profiler._events.clear()  # noqa: SLF001  (bench tool: drop the warm-up runs)
    for _ in range(a.runs):
        prof.run(None, feeds)
    mine, mine_nodes = medians(
        (e["name"], e["args"].get("op_type", "?"), e["dur"])
        for e in prof.profiler.events
        if e.get("cat") == "Node"
    )
    with tempfile.TemporaryDirectory() as tmp:
        oso.enable_profiling = True
        oso.profile_file_prefix = str(Path(tmp) / "ort")
        theirs = ort.InferenceSession(a.model, oso, providers=["CPUExecutionProvider"])
        for _ in range(a.runs):
            theirs.run(None, feeds)
        trace = json.loads(Path(theirs.end_profiling()).read_text())
    theirs_by, _ = medians(
        (e["name"], e["args"]["op_name"], e["dur"])
        for e in trace
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
    )
    s1 = sum(t for _, t in mine.values())
    s2 = sum(t for _, t in theirs_by.values())
    print(
        f"wall onnxep {w1:.0f} us, onnxruntime {w2:.0f} us ({w1 / w2:.2f}x); "
        f"kernels onnxep {s1:.0f} us ({sum(n for n, _ in mine.values())} nodes), "
        f"onnxruntime {s2:.0f} us ({sum(n for n, _ in theirs_by.values())} nodes)"
    )
    ops = sorted(
        set(mine) | set(theirs_by),
        key=lambda o: -max(mine.get(o, (0, 0))[1], theirs_by.get(o, (0, 0))[1]),
    )
    print(f"{'op type':36s} {'n':>4s} {'onnxep us':>10s} {'n':>4s} {'ort us':>9s}")
    for op in ops[: a.top]:
        n1, t1 = mine.get(op, (0, 0.0))
        n2, t2 = theirs_by.get(op, (0, 0.0))
        print(f"{op:36s} {n1:4d} {t1:10.1f} {n2:4d} {t2:9.1f}")
    for name, (op, t) in sorted(mine_nodes.items(), key=lambda kv: -kv[1][1])[: a.nodes]:
        print(f"  {t:8.1f} us  {op:28s} {name}")


if __name__ == "__main__":
    main()
