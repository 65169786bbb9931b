"""MatMulNBits tiles' thread split, before and after, in one process against onnxruntime.

    python bench/cpu_nbits_ab.py MODEL.onnx [--steps 30] [--rounds 4] [--past 16]

A genai-format int4 decoder's decode step (``bench/cpu_nbits_decode.py``'s feeds), run
by one onnxep session with the AVX2 tiles' split as this branch does it ("after":
``op_matmul_nbits._tiles``, an atomic chunk counter shared with ``nbits_threads``'
helpers) and as 663c75b did it ("before": A rounded in its own call, then
``nn_cpu.parallel_rows`` over column groups with the tiles' work counted 4x), swapped in
per step. Each step is onnxruntime's then one variant's, as ``bench/run_all.py``
alternates them (onnxruntime's pool threads may still spin when onnxep's step starts),
the variants in a fixed pseudo-random order; each round prints the medians and their
ratio to onnxruntime's over the same steps. On a loaded machine only the same round's
ratios compare.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def before_tiles(a2, packed, kb, block_size, out):
    """663c75b's tiles path, on the same packed weight."""
    from onnxep.providers_cpu import jit_nbits
    from onnxep.providers_cpu.ops.nn_cpu import parallel_rows

    aa, asg, asc = jit_nbits.loop("quantize_a")(a2, kb, block_size, block_size == 32)
    f = jit_nbits.loop("drive", packed.has_zp, block_size // 32)
    p = packed.p
    work = a2.shape[0] * out.shape[1] * kb * block_size
    parallel_rows(p.shape[0], work * 4, lambda g0, g1: f(p, aa, asg, asc, g0, g1, out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--past", type=int, default=16)
    a = ap.parse_args()

    import onnxep
    from bench.cpu_nbits_decode import feeds_for
    from bench.cpu_profiles import ort_session
    from onnxep.providers_cpu.ops import op_matmul_nbits as kern

    feeds = feeds_for(a.model, a.past)
    ours = onnxep.InferenceSession(a.model, providers=["cpu"])
    theirs = ort_session(a.model)
    after = kern._tiles  # noqa: SLF001 (swapped per step, restored after)

    def with_tiles(fn):
        def run():
            kern._tiles = fn  # noqa: SLF001
            try:
                ours.run(None, feeds)
            finally:
                kern._tiles = after  # noqa: SLF001

        return run

    variants = [("before", with_tiles(before_tiles)), ("after", with_tiles(after))]
    for _ in range(3):
        theirs.run(None, feeds)
        for _, f in variants:
            f()
    rnd = random.Random(0)
    for r in range(a.rounds):
        times: dict[str, list[float]] = {"onnxruntime": [], "before": [], "after": []}
        for _ in range(a.steps):
            order = list(variants)
            rnd.shuffle(order)
            for name, f in order:
                t0 = time.perf_counter()
                theirs.run(None, feeds)
                t1 = time.perf_counter()
                f()
                t2 = time.perf_counter()
                times["onnxruntime"].append(t1 - t0)
                times[name].append(t2 - t1)
        med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
        print(
            f"round {r}: onnxruntime {med['onnxruntime']:.2f} ms, before {med['before']:.2f} "
            f"({med['before'] / med['onnxruntime']:.2f}), after {med['after']:.2f} "
            f"({med['after'] / med['onnxruntime']:.2f})"
        )


if __name__ == "__main__":
    main()
