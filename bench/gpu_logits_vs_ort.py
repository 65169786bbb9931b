"""A prompt's last logits on onnxep and onnxruntime, side by side: is a greedy-token
difference a near tie or an error?

    python bench/gpu_logits_vs_ort.py MODEL_DIR [--prompts 1,16,128,2000] [--cpu-max 16]
        [--json out.json]

``bench/gpu_vs_ort.py`` compares greedy tokens only, and random-weight exports can make
two runtimes' first token differ either because their float rounding differs at a near
tie or because one of them computes something else. Per prompt length (random token ids,
empty past, one prefill run per side), one JSON line: each side's top-5 token ids and
logits and its top-1 margin, the largest and mean absolute difference of the last
position's logits between every two sides, and their correlation. Sides: onnxep on
``cuda,cpu``, onnxruntime's CUDA provider and, for prompts up to ``--cpu-max`` tokens,
onnxep's CPU provider as the referee (its kernels are the reference every provider is
checked against; onnxruntime's CPU provider is tried too and reported as skipped if it
cannot run the export).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.gpu_vs_ort import genai_spec, kv_dtype_of, ort_session, prefill_feeds  # noqa: E402


def _last_logits(run, feeds: dict) -> np.ndarray:
    return np.asarray(run(feeds), dtype=np.float32)[0, -1]


def _onnxep(spec: dict, providers: list[str]):
    import onnxep

    sess = onnxep.InferenceSession(spec["file"], providers=providers)
    if sess.get_providers()[0] != providers[0]:
        raise RuntimeError(f"{providers[0]} is not available: {sess.get_providers()}")
    kv = kv_dtype_of(sess.get_inputs(), spec["past_key"] % 0)
    return kv, lambda feeds: sess.run(["logits"], feeds)[0]


def _ort(spec: dict, provider: str):
    sess = ort_session(spec["file"], provider)
    if sess.get_providers()[0] != provider:
        raise RuntimeError(f"{provider} is not available: {sess.get_providers()}")
    kv = kv_dtype_of(sess.get_inputs(), spec["past_key"] % 0)
    return kv, lambda feeds: sess.run(["logits"], feeds)[0]


def summary(logits: np.ndarray) -> dict:
    top = np.argsort(-logits)[:5]
    return {
        "top5": [int(t) for t in top],
        "top5_logits": [round(float(logits[t]), 4) for t in top],
        "margin": float(logits[top[0]] - logits[top[1]]),
        "finite": bool(np.isfinite(logits).all()),
    }


def compare(a: np.ndarray, b: np.ndarray) -> dict:
    d = np.abs(a - b)
    return {
        "max_abs": float(d.max()),
        "mean_abs": float(d.mean()),
        "corr": float(np.corrcoef(a, b)[0, 1]),
        "same_top1": bool(np.argmax(a) == np.argmax(b)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--prompts", default="1,16,128,2000")
    ap.add_argument("--cpu-max", type=int, default=16, help="longest prompt the CPU sides run")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    spec = genai_spec(args.model_dir)
    makers = {
        "onnxep-cuda": lambda: _onnxep(spec, ["cuda", "cpu"]),
        "onnxruntime-cuda": lambda: _ort(spec, "CUDAExecutionProvider"),
        "onnxep-cpu": lambda: _onnxep(spec, ["cpu"]),
        "onnxruntime-cpu": lambda: _ort(spec, "CPUExecutionProvider"),
    }
    sides, skipped = {}, []
    for name, make in makers.items():
        try:
            sides[name] = make()
        except Exception as exc:
            skipped.append(f"{name}: {type(exc).__name__}: {exc}"[:300])
    rows = []
    for p in [int(x) for x in args.prompts.split(",") if x]:
        got = {}
        for name, (kv, run) in sides.items():
            if name.endswith("-cpu") and p > args.cpu_max:
                continue
            try:
                got[name] = _last_logits(run, prefill_feeds(spec, kv, p, seed=p))
            except Exception as exc:
                skipped.append(f"{name} prompt {p}: {type(exc).__name__}: {exc}"[:300])
        names = list(got)
        row = {
            "prompt": p,
            "sides": {n: summary(v) for n, v in got.items()},
            "pairs": {
                f"{a} vs {b}": compare(got[a], got[b])
                for i, a in enumerate(names)
                for b in names[i + 1 :]
            },
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    if skipped:
        print(json.dumps({"skipped": skipped}), flush=True)
    if args.json:
        args.json.write_text(
            json.dumps({"model": str(args.model_dir), "rows": rows, "skipped": skipped}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
