"""Split tests/cuda's files into N shards of about equal time, one line of paths per shard
(bench/gpu_check.sh runs one pytest process per line, side by side on the one GPU: most of
the suite's time is host work, model building and the CPU references it compares with).

The times are a whole run's seconds per file (bench/results/gpu-test-seconds.json, from its
junit file); a file not listed there counts as the median of those that are.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def shards(n: int, files: list[str], seconds: dict[str, float]) -> list[list[str]]:
    """Longest first, each to the shard with the least time so far."""
    default = statistics.median(seconds.values()) if seconds else 1.0
    out: list[list[str]] = [[] for _ in range(n)]
    load = [0.0] * n
    for f in sorted(files, key=lambda f: -seconds.get(f, default)):
        i = load.index(min(load))
        out[i].append(f)
        load[i] += seconds.get(f, default)
    return [s for s in out if s]


def main() -> int:
    n = int(sys.argv[1])
    times = ROOT / "bench" / "results" / "gpu-test-seconds.json"
    seconds = json.loads(times.read_text()) if times.is_file() else {}
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "cuda").glob("test_*.py"))
    for shard in shards(n, files, seconds):
        print(" ".join(shard))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
