"""tiny_ab's rows with and without some rewrite passes, against onnxruntime, in one process.

    python bench/tiny_rewrite_ab.py --off PASS [PASS ...] [--only genai hybrid ...]
                                    [--rounds 30] [--runs 40]

Three sessions per row (onnxep with every pass, onnxep with ``--off`` switched off through
``SessionOptions.disabled_rewrites``, onnxruntime) run one step's feeds in turn, the order
rotated each round, so the load of a shared machine, which moves the figures of separate
processes by 2-4x between rounds, hits the three alike. The decoders' feeds are one
decode step (``cpu_profile_decode.decode_feeds``, 16 cached tokens), hf_llama and llama_kv
their tiny_ab dims. Prints each side's median time and the medians of the per-round ratios
(each onnxep side over onnxruntime, and with over without).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from tiny_ab import ROWS, model_path  # noqa: E402


def _feeds(path: Path, kw: dict) -> dict:
    from cpu_profile_decode import decode_feeds

    import onnxep
    from onnxep.tools.random_inputs import random_inputs

    if "dims" not in kw:
        return decode_feeds(str(path), 16)
    sess = onnxep.InferenceSession(str(path), providers=["cpu"])
    return random_inputs(sess, kw["dims"], int_ranges={"input_ids": (0, 32)})


def _median_ms(fn, runs: int) -> float:
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def _ratio(ms: dict[str, list[float]], x: str, y: str) -> float:
    return statistics.median(p / q for p, q in zip(ms[x], ms[y]))


def main() -> None:
    import onnxruntime as ort

    import onnxep

    ap = argparse.ArgumentParser()
    ap.add_argument("--off", nargs="+", required=True)
    ap.add_argument("--only", nargs="*", default=["genai", "hybrid", "hf_llama", "llama_kv"])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--runs", type=int, default=40)
    a = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="tiny_rewrite_ab_"))
    for name in a.only:
        spec, kw = ROWS[name]
        path = str(model_path(spec, scratch))
        feeds = _feeds(path, kw)
        off = onnxep.SessionOptions(disabled_rewrites=a.off)
        sides = {
            "with": onnxep.InferenceSession(path, providers=["cpu"]),
            "without": onnxep.InferenceSession(path, off, providers=["cpu"]),
            "ort": ort.InferenceSession(path, providers=["CPUExecutionProvider"]),
        }
        runs = {k: (lambda s=s, f=feeds: s.run(None, f)) for k, s in sides.items()}
        for fn in runs.values():
            for _ in range(10):
                fn()
        names = list(runs)
        ms: dict[str, list[float]] = {k: [] for k in names}
        for r in range(a.rounds):
            for k in names[r % 3 :] + names[: r % 3]:
                ms[k].append(_median_ms(runs[k], a.runs))

        med = {k: statistics.median(v) for k, v in ms.items()}
        print(
            f"{name:10s} ms with {med['with']:.3f}, without {med['without']:.3f}, "
            f"ort {med['ort']:.3f}; over ort: with {_ratio(ms, 'with', 'ort'):.2f}x, "
            f"without {_ratio(ms, 'without', 'ort'):.2f}x; with / without "
            f"{_ratio(ms, 'with', 'without'):.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
