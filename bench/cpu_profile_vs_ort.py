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
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


def profile(name: str, runs: int, threads: int, top: int) -> None:
    import onnx
    from real_models import CORPUS, feeds, fetch

    import onnxep
    from bench.cpu_profiles import by_op, onnxep_events, ort_events, ort_session, print_by_op

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
    mine = by_op(onnxep_events(path, inputs, runs, threads))

    plain = ort_session(path, threads, spin=False)
    for _ in range(5):
        plain.run(None, inputs)
    t0 = time.perf_counter()
    for _ in range(runs):
        plain.run(None, inputs)
    ort_wall = (time.perf_counter() - t0) / runs * 1e6
    theirs_by = by_op(ort_events(path, inputs, runs, threads))

    ours_sum = sum(t for _, t in mine.values())
    ort_sum = sum(t for _, t in theirs_by.values())
    print(
        f"\n== {name}: wall per run onnxep {ours_wall:.0f} us, onnxruntime {ort_wall:.0f} us "
        f"({ours_wall / ort_wall:.2f}x); kernels onnxep {ours_sum:.0f} us, "
        f"onnxruntime {ort_sum:.0f} us"
    )
    print_by_op(mine, theirs_by, top)


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
