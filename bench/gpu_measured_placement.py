"""``placement="measured"`` on real corpus models: what it timed and what it chose.

    python bench/gpu_measured_placement.py NAME [NAME ...] [--real-dir .device/extra/real]
        [--providers cuda,cpu] [--budget-ms 1500]

Each ``NAME.onnx`` (a model of tests/real_models.py, copied into ``--real-dir``) gets a
session with ``SessionOptions(placement="measured")``, its timing feeds shaped as the
corpus feeds it (``placement_shapes``; an integer scalar input held at its value through
``placement_int_ranges``), then 30 runs of the chosen placement on the corpus's feeds;
prints the median and the placement report (every candidate's median, and why one won).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def main(argv: list[str] | None = None) -> int:
    import onnx
    import real_models as R

    import onnxep

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="+")
    ap.add_argument("--real-dir", type=Path, default=Path(".device/extra/real"))
    ap.add_argument("--providers", default="cuda,cpu")
    ap.add_argument("--budget-ms", type=float, default=1500.0)
    a = ap.parse_args(argv)
    corpus = {m.name: m for m in R.CORPUS}
    for name in a.names:
        data = (a.real_dir / f"{name}.onnx").read_bytes()
        feeds = R.feeds(corpus[name], onnx.load_from_string(data))
        opts = onnxep.SessionOptions(placement="measured", placement_budget_ms=a.budget_ms)
        opts.placement_shapes = {k: list(v.shape) for k, v in feeds.items()}
        opts.placement_int_ranges = {
            k: (int(v), int(v) + 1) for k, v in feeds.items() if v.dtype.kind == "i" and v.ndim == 0
        }
        sess = onnxep.InferenceSession(data, opts, providers=a.providers.split(","))
        for _ in range(5):
            sess.run(None, feeds)
        times = []
        for _ in range(30):
            t = time.perf_counter()
            sess.run(None, feeds)
            times.append((time.perf_counter() - t) * 1e3)
        print(f"## {name}: measured placement, run median {statistics.median(times):.3f} ms")
        print("\n".join(sess.placement().measured.format()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
