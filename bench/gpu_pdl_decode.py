"""Programmatic dependent launch on and off, in the same run: ms per greedy decode step.

    python bench/gpu_pdl_decode.py MODEL [MODEL...] [--steps 64] [--captures off,auto]
        [--contexts 16,2000] [--rounds 3]

For each decoder, capture mode and context, two sessions on ``["cuda", "cpu"]`` - one built
with ``ONNXEP_CUDA_PDL=0`` (every kernel launched as before), one with programmatic dependent
launch where the kernels opt in (``providers_cuda/launch.py``) - decode the same greedy tokens
with their steps interleaved, one step of each in turn, each step returning with the device
idle (``GreedyDecoder(pipeline=False)``, as ``bench/gpu_fusions.py`` times). The prompt is
``context`` tokens. Prints one JSON line per case: median ms per step and tokens per second
of each side over ``--rounds`` x ``--steps`` steps, the ratio, whether the tokens agree, and
each side's captures, replays and fallbacks.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gpu_fusions import SETTLE, _providers, interleaved_decoders  # noqa: E402


def _session(path: str, capture: str, pdl: bool):
    import onnxep

    before = os.environ.get("ONNXEP_CUDA_PDL")
    os.environ["ONNXEP_CUDA_PDL"] = "1" if pdl else "0"
    try:  # the kernels read the switch when the session builds them
        return onnxep.InferenceSession(path, providers=_providers(["cuda", "cpu"], capture))
    finally:
        if before is None:
            os.environ.pop("ONNXEP_CUDA_PDL", None)
        else:
            os.environ["ONNXEP_CUDA_PDL"] = before


def run_case(path: str, capture: str, context: int, args: argparse.Namespace) -> dict:
    sides = {"pdl-off": _session(path, capture, False), "pdl-on": _session(path, capture, True)}
    prompt = np.random.default_rng(0).integers(1, 100, context)
    steps = args.rounds * args.steps
    tokens = 1 + SETTLE + steps
    capacity = context + tokens
    decoders = interleaved_decoders(sides, prompt, tokens, capacity, tokens)
    case: dict = {"model": Path(path).parent.name, "capture": capture, "context": context}
    toks = {}
    for key, d in decoders.items():
        r = d.finish()
        timed = r.step_ms[1 + SETTLE :]
        ms = float(np.median(timed))
        stats = r.capture_stats or {}
        case[key] = {
            "ms_per_step": round(ms, 4),
            "tok_s": round(1000.0 / ms, 1),
            "timed_steps": len(timed),
            "capture": {k: stats.get(k) for k in ("captures", "replays", "fallbacks")},
            "programmatic_launch": sides[key].providers[0].describe().get("programmatic_launch"),
        }
        toks[key] = r.tokens
    case["on_over_off"] = round(case["pdl-on"]["ms_per_step"] / case["pdl-off"]["ms_per_step"], 4)
    case["tokens_agree"] = toks["pdl-on"] == toks["pdl-off"]
    return case


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="+")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--captures", default="auto,off")
    ap.add_argument("--contexts", default="16,2000")
    args = ap.parse_args(argv)
    for model in args.models:
        for capture in args.captures.split(","):
            for context in (int(c) for c in args.contexts.split(",")):
                print(json.dumps(run_case(model, capture, context, args)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
