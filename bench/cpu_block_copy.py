"""How long NumPy's contiguous copy (glibc ``memmove``) takes by destination - source mod 4096.

    python bench/cpu_block_copy.py [--sizes 4096 65536 409600 819200] [--runs 200]

Source and destination lie in one buffer, the source page-aligned plus 16 bytes (as NumPy's
heap allocations often are); each distance is the destination's offset past the source's,
modulo 4096. On AMD Zen 3 glibc's ``rep movsb`` range (4 KB to the non-temporal threshold)
runs about 10x slower at distances 1-63 (``providers_cpu/ops/block_copy.py``); the last
column copies the slow case through ``block_copy.copy_run`` instead.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DISTANCES = (0, 16, 32, 48, 64, 2048)


def _median_us(fn, runs: int) -> float:
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def main(argv: list[str] | None = None) -> None:
    from onnxep.providers_cpu.ops.block_copy import copy_run

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 65536, 409600, 819200])
    ap.add_argument("--runs", type=int, default=200)
    a = ap.parse_args(argv)
    buf = np.empty(max(a.sizes) * 2 + (1 << 20), np.uint8)
    base = (-buf.ctypes.data) % 4096 + 16
    print("bytes " + " ".join(f"{d:>7}" for d in DISTANCES) + "  16 (copy_run)")
    for n in a.sizes:
        src = buf[base : base + n]
        row = []
        for d in (*DISTANCES, 16):
            d0 = base + max(a.sizes) + 4096 - (max(a.sizes) % 4096) + d
            dst = buf[d0 : d0 + n]
            assert (dst.ctypes.data - src.ctypes.data) % 4096 == d
            row.append(_median_us(lambda d=dst, s=src: d.__setitem__(Ellipsis, s), a.runs))
        row[-1] = _median_us(lambda d=dst, s=src: copy_run(d, s), a.runs)
        print(f"{n:>7} " + " ".join(f"{v:7.1f}" for v in row))


if __name__ == "__main__":
    main()
