"""LSTM / GRU on the GPU: onnxep's CUDA provider against onnxruntime, interleaved in one process.

    python bench/gpu_rnn_bench.py [--rounds 30] [--cases vad-b1,lstm-h128-t100-b1,...]

Cases: the Conv1d + LSTM voice-activity model (tests/cuda/rnn_cases.py, as torch exports
bench/factory's VoiceActivity; ``vad-bN``: N clips of 4000 samples, bench/gpu_vision.py's
shape) and single nodes
(``lstm-h128-t100-b1``: hidden 128, 100 steps, batch 1; ``-bi``: bidirectional). Sides:
``onnxep`` (CUDA, captured whole), ``onnxep_eager`` (CUDA, capture off: one projection GEMM
and one recurrence launch per node, launched from Python), ``ort`` (onnxruntime's
CUDAExecutionProvider when this onnxruntime has it, else its CPU provider; the row says).
Each round runs every side once, in turn, so a noisy neighbour hits all sides alike; one
JSON line per case with each side's median ms and ``onnxep / ort``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "cuda"))

import rnn_cases as cases  # noqa: E402

import onnxep  # noqa: E402

CASES = (
    "vad-b1",
    "vad-b8",
    "lstm-h64-t100-b1",
    "lstm-h128-t100-b1",
    "lstm-h128-t100-b16-bi",
    "gru-h256-t50-b4",
    "lstm-h512-t20-b2",
)


def _case(name: str):
    if name.startswith("vad-b"):
        batch = int(name[5:])
        model = cases.voice_activity_model(samples=4000)
        audio = np.random.default_rng(0).uniform(-1, 1, (batch, 1, 4000)).astype(np.float32)
        return model, {"audio": audio}
    parts = name.split("-")
    op = parts[0].upper()
    hidden, steps, batch = int(parts[1][1:]), int(parts[2][1:]), int(parts[3][1:])
    attrs = {"direction": "bidirectional"} if "bi" in parts[4:] else {}
    c = cases.RnnCase(name, op, steps, batch, 64, hidden, attrs=attrs)
    return cases.case_model(c), cases.case_feeds(c)


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args(argv)
    import onnxruntime as ort

    ort_cuda = "CUDAExecutionProvider" in ort.get_available_providers()
    ort_providers = ["CUDAExecutionProvider"] if ort_cuda else ["CPUExecutionProvider"]
    for name in args.cases.split(","):
        model, feeds = _case(name)
        blob = model.SerializeToString()
        sides = {
            "onnxep": onnxep.InferenceSession(blob, providers=[("cuda", {"capture": "whole"})]),
            "onnxep_eager": onnxep.InferenceSession(blob, providers=[("cuda", {"capture": "off"})]),
            "ort": ort.InferenceSession(blob, providers=ort_providers),
        }
        want = sides["ort"].run(None, feeds)
        for key in ("onnxep", "onnxep_eager"):
            for _ in range(3):  # warm-up: compile, capture
                got = sides[key].run(None, feeds)
            err = max(float(np.abs(g.astype(np.float32) - w).max()) for g, w in zip(got, want))
            if err > 1e-3:
                raise SystemExit(f"{name}: {key} differs from onnxruntime by {err}")
        for _ in range(3):
            sides["ort"].run(None, feeds)
        times: dict[str, list[float]] = {k: [] for k in sides}
        for _ in range(args.rounds):
            for key, sess in sides.items():
                times[key].append(_time(lambda s=sess, f=feeds: s.run(None, f)))
        med = {k: statistics.median(v) for k, v in times.items()}
        row = {
            "case": name,
            **{f"{k}_ms": round(v, 4) for k, v in med.items()},
            "onnxep_over_ort": round(med["onnxep"] / med["ort"], 3),
            "ort_provider": ort_providers[0],
            "capture": sides["onnxep"].capture_plan().mode,
            "rounds": args.rounds,
        }
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
