"""Softmax/LogSoftmax's one compiled call on and off in one process, against onnxruntime.

    python bench/cpu_softmax_ab.py MODEL [--rounds 1000] [--threads 0]

MODEL as in bench/cpu_pair_ab.py (a corpus name or the BERT encoder's file). One onnxep
session; ``op_softmax.ONE_CALL`` (read per call) switched round by round, the order of
the three runs (on, off, onnxruntime) rotating; the median of per-round ratios to
onnxruntime for each side.
"""

from __future__ import annotations

import argparse
import statistics
import time

from cpu_pair_ab import model_feeds, pair_sessions


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args(argv)
    from onnxep.providers_cpu.ops import op_softmax

    path, inputs = model_feeds(a.model)
    ours, theirs = pair_sessions(path, a.threads)

    def on():
        op_softmax.ONE_CALL = True
        ours.run(None, inputs)

    def off():
        op_softmax.ONE_CALL = False
        ours.run(None, inputs)

    def ref():
        theirs.run(None, inputs)

    sides = [on, off, ref]
    for _ in range(10):
        for f in sides:
            f()
    times: dict = {f: [] for f in sides}
    for i in range(a.rounds):
        for f in sides[i % 3 :] + sides[: i % 3]:
            t0 = time.perf_counter()
            f()
            times[f].append(time.perf_counter() - t0)
    op_softmax.ONE_CALL = True
    ms = {f.__name__: statistics.median(t) * 1e3 for f, t in times.items()}
    r_on = statistics.median(x / y for x, y in zip(times[on], times[ref], strict=True))
    r_off = statistics.median(x / y for x, y in zip(times[off], times[ref], strict=True))
    print(
        f"{a.model} threads={a.threads}: one call {ms['on']:.3f} ms ({r_on:.2f}), earlier "
        f"steps {ms['off']:.3f} ms ({r_off:.2f}), onnxruntime {ms['ref']:.3f} ms"
    )


if __name__ == "__main__":
    main()
