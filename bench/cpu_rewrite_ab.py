"""A corpus model with and without some rewrite passes, against onnxruntime, interleaved.

    python bench/cpu_rewrite_ab.py MODEL --off PASS [PASS ...] [--runs 40] [--threads 0]

Three sessions in one process (onnxep with every pass, onnxep with ``--off`` passes
switched off through ``SessionOptions.disabled_rewrites``, onnxruntime) run one after
the other per round, in an order that turns each round, so a load change on a shared
machine hits all three alike. Prints
each side's median and the median of each onnxep side's ratio to the onnxruntime run
of the same round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from bench.cpu_real_models import ort_session  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--off", nargs="+", required=True)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()

    import onnx
    from real_models import CORPUS, feeds, fetch

    import onnxep

    model = next(m for m in CORPUS if m.name == args.model)
    path = fetch(model)
    inputs = feeds(model, onnx.load(str(path), load_external_data=False))
    sides = {
        "with": onnxep.InferenceSession(
            str(path), onnxep.SessionOptions(intra_op_num_threads=args.threads), providers=["cpu"]
        ),
        "without": onnxep.InferenceSession(
            str(path),
            onnxep.SessionOptions(intra_op_num_threads=args.threads, disabled_rewrites=args.off),
            providers=["cpu"],
        ),
        "onnxruntime": ort_session(path, args.threads),
    }
    outs = {k: s.run(None, inputs) for k, s in sides.items()}
    for k in ("with", "without"):
        diff = max(float(np.max(np.abs(a - b))) for a, b in zip(outs[k], outs["onnxruntime"]))
        print(f"{k}: largest difference from onnxruntime {diff:.3g}")
    for s in sides.values():
        for _ in range(3):
            s.run(None, inputs)
    samples: dict[str, list[float]] = {k: [] for k in sides}
    names = list(sides)
    for i in range(args.runs):
        # the order turns each round: the side run right after onnxruntime reads colder
        # caches (a null A/B, one pass off that never fires, read 1.22 against 1.08)
        for k in names[i % 3 :] + names[: i % 3]:
            s = sides[k]
            t0 = time.perf_counter()
            s.run(None, inputs)
            samples[k].append(time.perf_counter() - t0)
    ort = np.array(samples["onnxruntime"])
    for k, v in samples.items():
        ratio = "" if k == "onnxruntime" else f"  ratio {float(np.median(np.array(v) / ort)):.2f}"
        print(f"{k:12s} {statistics.median(v) * 1e3:8.3f} ms{ratio}")


if __name__ == "__main__":
    main()
