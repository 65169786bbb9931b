"""Corpus models at the session's default thread count and at one thread, against onnxruntime.

    python bench/cpu_threads_ab.py MODEL [MODEL ...] [--rounds 40]

Three sessions per model, run one after the other in each round on the corpus feeds:
onnxep with ``intra_op_num_threads=0`` (the thread policy's count), onnxep with 1, and
onnxruntime at its default. Prints each side's median and the median over rounds of
onnxep / onnxruntime in that round, so both onnxep figures are same-run ratios against
the same onnxruntime (on the shared machine onnxruntime's own time moves 2x between
runs). The policy's count is printed beside the model's name.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> None:
    import numpy as np
    import onnx
    from real_models import CORPUS, feeds, fetch

    import onnxep
    from bench.cpu_real_models import ort_session

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rounds", type=int, default=40)
    a = ap.parse_args(argv)
    for name in a.models:
        model = next(m for m in CORPUS if m.name == name)
        path = fetch(model)
        inputs = feeds(model, onnx.load(str(path), load_external_data=False))
        ours = {
            t: onnxep.InferenceSession(
                str(path), onnxep.SessionOptions(intra_op_num_threads=t), providers=["cpu"]
            )
            for t in (0, 1)
        }
        theirs = ort_session(path, 0)
        sides = {
            "default": lambda s=ours[0], f=inputs: s.run(None, f),
            "one": lambda s=ours[1], f=inputs: s.run(None, f),
            "ort": lambda s=theirs, f=inputs: s.run(None, f),
        }
        for fn in sides.values():
            for _ in range(3):
                fn()
        times: dict[str, list[float]] = {k: [] for k in sides}
        for _ in range(a.rounds):
            for k, fn in sides.items():
                t0 = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t0)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        ort_t = np.array(times["ort"])
        ratio = {k: float(np.median(np.array(times[k]) / ort_t)) for k in ("default", "one")}
        count = ours[0].providers[0].blas_thread_count
        print(
            f"{name} (policy: {count} thread(s)): default {med['default']:.2f} ms "
            f"({ratio['default']:.2f}x), one thread {med['one']:.2f} ms ({ratio['one']:.2f}x), "
            f"onnxruntime {med['ort']:.2f} ms"
        )


if __name__ == "__main__":
    main()
