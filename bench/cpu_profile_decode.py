"""Where a decode step's time goes, per node and op type, onnxep's CPU provider against
onnxruntime's, on one set of decode-shaped feeds (one new token over ``--past`` cached ones).

    python bench/cpu_profile_decode.py MODEL [--past 16] [--runs 200] [--top 25] [--nodes 0]

Both sides use their own profiler in this one process; the table is the sum, per op type,
of each node's median over the runs. ``--nodes N`` also lists onnxep's N slowest nodes.
The wall figures come from unprofiled sessions timed alternately on the same feeds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
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


def main() -> None:
    import onnxep
    from bench.cpu_profiles import (
        by_op,
        node_medians,
        onnxep_events,
        ort_events,
        ort_session,
        print_by_op,
    )

    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--past", type=int, default=16)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--nodes", type=int, default=0)
    a = ap.parse_args()
    feeds = decode_feeds(a.model, a.past)
    ours = onnxep.InferenceSession(a.model, providers=["cpu"])
    plain = ort_session(a.model, spin=False)
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

    events = onnxep_events(a.model, feeds, a.runs)
    mine, mine_nodes = by_op(events), node_medians(events)
    theirs_by = by_op(ort_events(a.model, feeds, a.runs))
    s1 = sum(t for _, t in mine.values())
    s2 = sum(t for _, t in theirs_by.values())
    print(
        f"wall onnxep {w1:.0f} us, onnxruntime {w2:.0f} us ({w1 / w2:.2f}x); "
        f"kernels onnxep {s1:.0f} us ({sum(n for n, _ in mine.values())} nodes), "
        f"onnxruntime {s2:.0f} us ({sum(n for n, _ in theirs_by.values())} nodes)"
    )
    print_by_op(mine, theirs_by, a.top)
    for name, (op, t) in sorted(mine_nodes.items(), key=lambda kv: -kv[1][1])[: a.nodes]:
        print(f"  {t:8.1f} us  {op:28s} {name}")


if __name__ == "__main__":
    main()
