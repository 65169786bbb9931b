"""The split hand-off and bounds, A/B in one process: corpus models against onnxruntime.

    python bench/cpu_handoff_ab.py MODEL [MODEL ...] [--rounds 30] [--sides 16:exec 16:native4]

A side ``S:MODE`` is an onnxep session made with ``thread_policy.CONV_SPLIT_MACS`` = S
MiB multiply-adds (the session's thread count), run with ``exec`` (every split through the
executor, ``nn_cpu.parallel_rows``, from S) or ``nativeN`` (the compiled kernels' splits
through ``handoff.py`` from N MiB, ``nn_cpu.COMPILED_MIN``; other splits from 16). Every
round runs each side and onnxruntime at its default once, in a shuffled order, on the
corpus feeds. Prints each side's median and the median over rounds of onnxep /
onnxruntime of that round.
"""

from __future__ import annotations

import argparse
import random
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
    from onnxep.providers_cpu import thread_policy
    from onnxep.providers_cpu.ops import nn_cpu

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--sides", nargs="+", default=["16:exec", "16:native16", "16:native4"])
    a = ap.parse_args(argv)
    for name in a.models:
        model = next(m for m in CORPUS if m.name == name)
        path = fetch(model)
        inputs = feeds(model, onnx.load(str(path), load_external_data=False))
        sides = {}
        for spec in a.sides:
            bound, mode = spec.split(":")
            thread_policy.CONV_SPLIT_MACS = int(bound) << 20
            sess = onnxep.InferenceSession(str(path), providers=["cpu"])
            count = sess.providers[0].blas_thread_count
            native = mode.startswith("native")
            split = int(mode[6:] if native else bound) << 20

            def run(s=sess, nat=native, b=split, f=inputs):
                nn_cpu.NATIVE, nn_cpu.COMPILED_MIN = nat, b
                nn_cpu._PARALLEL_MIN = 1 << 24 if nat else b  # noqa: SLF001
                return s.run(None, f)

            sides[f"{spec}/{count}t"] = run
        thread_policy.CONV_SPLIT_MACS = 1 << 24
        theirs = ort_session(path, 0)
        sides["ort"] = lambda s=theirs, f=inputs: s.run(None, f)
        for fn in sides.values():
            for _ in range(3):
                fn()
        times: dict[str, list[float]] = {k: [] for k in sides}
        rng = random.Random(0)
        order = list(sides.items())
        for _ in range(a.rounds):
            rng.shuffle(order)  # no side always runs after another (a helper's spin)
            for k, fn in order:
                t0 = time.perf_counter()
                fn()
                times[k].append(time.perf_counter() - t0)
        ort_t = np.array(times["ort"])
        parts = []
        for k, v in times.items():
            if k != "ort":
                ratio = float(np.median(np.array(v) / ort_t))
                parts.append(f"{k} {statistics.median(v) * 1e3:.2f} ms ({ratio:.2f}x)")
        ort_ms = statistics.median(ort_t) * 1e3
        print(f"{name}: " + ", ".join(parts) + f", onnxruntime {ort_ms:.2f} ms")


if __name__ == "__main__":
    main()
