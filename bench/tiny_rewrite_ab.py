"""tiny_ab's rows with and without some rewrite passes, against onnxruntime, in one process.

    python bench/tiny_rewrite_ab.py --off PASS [PASS ...] [--off PASS ...] [--only genai ...]
                                    [--rounds 30] [--runs 40]

A session per row for onnxep with every pass, one for each ``--off`` set (those passes
switched off through ``SessionOptions.disabled_rewrites``) and onnxruntime run one step's
feeds in turn, the order rotated each round, so the load of a shared machine, which moves
the figures of separate processes by 2-4x between rounds, hits them alike. The decoders'
feeds are one decode step (``cpu_profile_decode.decode_feeds``, 16 cached tokens), hf_llama
and llama_kv their tiny_ab dims. Prints each side's median time and the medians of the
per-round ratios (each onnxep side over onnxruntime, and over the side with every pass).
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
    ap.add_argument("--off", nargs="+", action="append", required=True)
    ap.add_argument("--only", nargs="*", default=["genai", "hybrid", "hf_llama", "llama_kv"])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--runs", type=int, default=40)
    a = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="tiny_rewrite_ab_"))
    for name in a.only:
        spec, kw = ROWS[name]
        path = str(model_path(spec, scratch))
        feeds = _feeds(path, kw)
        sides = {"with": onnxep.InferenceSession(path, providers=["cpu"])}
        for off in a.off:
            opts = onnxep.SessionOptions(disabled_rewrites=off)
            sides["-" + ",".join(off)] = onnxep.InferenceSession(path, opts, providers=["cpu"])
        sides["ort"] = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        runs = {k: (lambda s=s, f=feeds: s.run(None, f)) for k, s in sides.items()}
        for fn in runs.values():
            for _ in range(10):
                fn()
        names = list(runs)
        ms: dict[str, list[float]] = {k: [] for k in names}
        for r in range(a.rounds):
            i = r % len(names)
            for k in names[i:] + names[:i]:
                ms[k].append(_median_ms(runs[k], a.runs))
        med = {k: statistics.median(v) for k, v in ms.items()}
        print(f"{name:10s} ort {med['ort']:.3f} ms", flush=True)
        for k in names[:-1]:
            print(
                f"  {k:50s} {med[k]:.3f} ms, over ort {_ratio(ms, k, 'ort'):.2f}x, "
                f"over with {_ratio(ms, k, 'with'):.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
