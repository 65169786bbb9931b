"""The split hand-off alone: a synthetic compiled job on one thread, split by the executor
(``nn_cpu.parallel_rows``) and by the compiled split (``handoff.py``), interleaved.

    python bench/cpu_handoff.py [--rounds 40] [--burst 10] [--gap-us 30] [--jobs-us 50 100]

The job is a numba ``nogil`` loop over 64 rows whose one-thread time is calibrated to each
``--jobs-us``. Each round runs every side ``--burst`` times in a row (a model's
convolutions, one after another), and between two timed calls the caller busy-waits
``--gap-us`` (the executor's time between two convolutions of a run). Prints the median
and 90th percentile of each side in microseconds; a split that pays is under the
one-thread median.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> None:
    import numpy as np

    from onnxep.providers_cpu import jit
    from onnxep.providers_cpu.ops import nn_cpu
    from onnxep.providers_cpu.threads import blas_threads

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--burst", type=int, default=10)
    ap.add_argument("--gap-us", type=float, default=30.0)
    ap.add_argument("--jobs-us", type=float, nargs="+", default=[50, 100, 200, 400])
    a = ap.parse_args(argv)
    if not jit.ENABLED:
        raise SystemExit("needs numba")

    @jit.nb.njit(nogil=True)
    def job(reps, r0, r1, x):
        s = 0.0
        for _ in range(r0, r1):
            for _ in range(reps):
                for i in range(x.shape[0]):
                    s += x[i] * 1.0000001
        x[0] += s * 0.0

    x = np.ones(256)
    rows = 64

    def reps_for(us: float) -> int:
        job(1, 0, rows, x)
        best = min(_timed(lambda: job(50, 0, rows, x)) for _ in range(5)) / 50
        return max(1, int(us * 1e-6 / best))

    def one(reps):
        job(reps, 0, rows, x)

    def executor(reps):
        nn_cpu.parallel_rows(rows, 1 << 40, lambda r0, r1: job(reps, r0, r1, x))

    def native(reps):
        nn_cpu.parallel_compiled(rows, 1 << 40, job, (reps,), (x,))

    sides = {"one thread": one, "executor": executor, "compiled split": native}
    with blas_threads(2):
        native(1)
        for us in a.jobs_us:
            reps = reps_for(us)
            times: dict[str, list[float]] = {k: [] for k in sides}
            for _ in range(a.rounds):
                for k, f in sides.items():
                    for _ in range(a.burst):
                        times[k].append(_timed(lambda f=f, r=reps: f(r)))
                        t1 = time.perf_counter()
                        while time.perf_counter() - t1 < a.gap_us * 1e-6:
                            pass
            cells = [
                f"{k} {statistics.median(v) * 1e6:.0f} / {np.percentile(v, 90) * 1e6:.0f}"
                for k, v in times.items()
            ]
            print(f"job {us:.0f} us (median / p90 us): " + ", ".join(cells), flush=True)


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
