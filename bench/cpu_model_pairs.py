"""Corpus models on onnxep's CPU provider and onnxruntime, run by run alternately, with
percentiles and the median of the per-pair ratios (the steadiest figure on a loaded
machine, where either side's own time moves between rounds).

    python bench/cpu_model_pairs.py MODEL [MODEL ...] [--runs 300] [--seconds 20] [--threads 1]

For an A/B between two trees, run it from each tree's venv one after the other.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def pairs(name: str, runs: int, seconds: float, threads: int) -> str:
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
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 4
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    theirs = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    for _ in range(5):
        ours.run(None, inputs)
        theirs.run(None, inputs)
    a, b = [], []
    end = time.perf_counter() + seconds
    while len(a) < runs and time.perf_counter() < end:
        t0 = time.perf_counter()
        ours.run(None, inputs)
        t1 = time.perf_counter()
        theirs.run(None, inputs)
        t2 = time.perf_counter()
        a.append(t1 - t0)
        b.append(t2 - t1)
    ta, tb = np.array(a) * 1e3, np.array(b) * 1e3
    p10a, p10b = np.percentile(ta, 10), np.percentile(tb, 10)
    meda, medb = np.median(ta), np.median(tb)
    return (
        f"{name:22s} n={len(ta)}  p10 {p10a:.3f}/{p10b:.3f} ms = {p10a / p10b:.2f}  "
        f"median {meda:.3f}/{medb:.3f} = {meda / medb:.2f}  "
        f"median of pair ratios {np.median(ta / tb):.2f}"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    for name in a.models:
        print(pairs(name, a.runs, a.seconds, a.threads), flush=True)


if __name__ == "__main__":
    main()
