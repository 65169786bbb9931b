"""onnxep against onnxruntime on one model, run by run, for A/B rounds across checkouts.

    python bench/cpu_pair_ab.py MODEL [--rounds 200] [--threads 0]

MODEL is a corpus name (tests/real_models.py, its feeds) or a model file; a file whose
inputs are named input_ids / attention_mask / token_type_ids (the BERT encoder that
``bench/make_models.py --kind bert`` writes, as bench/run_all.py's row does) gets [1, 64]
ids, ones and zeros. Both sessions in this one process, the order turning each round;
prints each side's median and the median of per-round ratios, which is what to compare
between two checkouts' venvs run one after the other (the machine's state moves
onnxruntime's own time between processes, so compare ratios, not milliseconds).
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


def model_feeds(model: str):
    """(model path, feeds) for a corpus name or a model file (module docstring)."""
    import onnx

    if Path(model).is_file():
        names = [i.name for i in onnx.load(model, load_external_data=False).graph.input]
        rng = np.random.default_rng(0)
        make = {
            "input_ids": lambda: rng.integers(0, 1024, (1, 64)).astype(np.int64),
            "attention_mask": lambda: np.ones((1, 64), np.int64),
            "token_type_ids": lambda: np.zeros((1, 64), np.int64),
        }
        if set(names) - set(make):
            raise SystemExit(f"{model}: no feeds for inputs {sorted(set(names) - set(make))}")
        return model, {n: make[n]() for n in names}
    from real_models import CORPUS, feeds, fetch

    entry = next(m for m in CORPUS if m.name == model)
    path = fetch(entry)
    return str(path), feeds(entry, onnx.load(str(path), load_external_data=False))


def pair_sessions(path: str, threads: int):
    """An onnxep CPU session and a silent onnxruntime one on ``path``, ``threads`` intra-op
    threads each (0: each side's default)."""
    import onnxruntime as ort

    import onnxep

    ours = onnxep.InferenceSession(
        path, onnxep.SessionOptions(intra_op_num_threads=threads), providers=["cpu"]
    )
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 4
    return ours, ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args(argv)
    import onnxep

    path, inputs = model_feeds(a.model)
    ours, theirs = pair_sessions(path, a.threads)
    diff = max(
        float(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)).max(initial=0))
        for x, y in zip(ours.run(None, inputs), theirs.run(None, inputs), strict=True)
    )
    for _ in range(10):
        ours.run(None, inputs)
        theirs.run(None, inputs)
    times: dict[object, list[float]] = {ours: [], theirs: []}
    for i in range(a.rounds):
        for sess in (ours, theirs) if i % 2 == 0 else (theirs, ours):
            t0 = time.perf_counter()
            sess.run(None, inputs)
            times[sess].append(time.perf_counter() - t0)
    ratios = [x / y for x, y in zip(times[ours], times[theirs], strict=True)]
    print(
        f"{Path(onnxep.__file__).parents[1]} {a.model} threads={a.threads}: onnxep "
        f"{statistics.median(times[ours]) * 1e3:.3f} ms, onnxruntime "
        f"{statistics.median(times[theirs]) * 1e3:.3f} ms, median of ratios "
        f"{statistics.median(ratios):.2f}, largest output difference {diff:.1e}"
    )


if __name__ == "__main__":
    main()
