"""placement="measured" on a voice-activity model and a CNN, beside onnxruntime in one process.

    python3 bench/placement_measured.py [--providers cuda,cpu] [--runs 30] [--budget-ms 2000]
        [--json OUT.json]

The models are exported here with torch: a voice-activity model (a Conv1d front end, an
LSTM, a dense head; [1, 1, 4000] audio) and the factory's ResNet-style CNN
(bench/factory/torch_models.py, batch 1 and 8 of 3x64x64). For each, a session with
``placement="measured"`` on ``--providers`` prints what it timed and why it chose what it
chose (``placement().measured``); then ``sess.run`` with host arrays of the measured
session, of the session with the list as given (``placement="priority"``) and of
onnxruntime (its CUDA provider when the list names cuda and it has one, else its CPU
provider) run interleaved, and the medians of ``--runs`` are printed with the measured
session's ratio to the others. On the GPU machine the issue expects the voice-activity
model on the CPU and the CNN on CUDA.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def voice_activity() -> tuple[bytes, dict[str, np.ndarray]]:
    import torch

    sys.path.insert(0, str(ROOT))
    from bench.factory.torch_models import VoiceActivity

    torch.manual_seed(0)
    x = torch.randn(1, 1, 4000)
    return _export(VoiceActivity().eval(), x, "audio"), {"audio": x.numpy()}


def resnet(batch: int) -> tuple[bytes, dict[str, np.ndarray]]:
    import torch

    sys.path.insert(0, str(ROOT))
    from bench.factory.torch_models import ResNet

    torch.manual_seed(0)
    net = ResNet().eval()
    x = torch.randn(batch, 3, 64, 64)
    return _export(net, x, "image"), {"image": x.numpy()}


def _export(module: Any, x: Any, name: str) -> bytes:
    import torch

    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), f, dynamo=False, input_names=[name])
    return f.getvalue()


def _ort(model: bytes, providers: list[str]) -> Any:
    import onnxruntime as ort

    want = ["CUDAExecutionProvider"] if "cuda" in providers else []
    have = [p for p in want if p in ort.get_available_providers()]
    return ort.InferenceSession(model, providers=[*have, "CPUExecutionProvider"])


def one(name: str, model: bytes, feeds: dict, providers: list[str], runs: int, budget: float):
    import onnxep

    opts = onnxep.SessionOptions(placement="measured", placement_budget_ms=budget)
    shapes = {k: list(v.shape) for k, v in feeds.items()}
    opts.placement_shapes = shapes
    t0 = time.perf_counter()
    measured = onnxep.InferenceSession(model, opts, providers=providers)
    made_ms = (time.perf_counter() - t0) * 1e3
    m = measured.placement().measured
    print(f"== {name}: session made in {made_ms:.0f} ms")
    print("\n".join(m.format()))
    sides = {
        "measured": measured,
        "priority": onnxep.InferenceSession(model, providers=providers),
        "onnxruntime": _ort(model, providers),
    }
    for s in sides.values():
        for _ in range(3):
            s.run(None, feeds)
    times: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(runs):
        for k, s in sides.items():
            t = time.perf_counter()
            s.run(None, feeds)
            times[k].append((time.perf_counter() - t) * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        "sess.run medians: "
        + ", ".join(f"{k} {v:.3f} ms" for k, v in med.items())
        + f"; measured/priority {med['measured'] / med['priority']:.2f}x, "
        f"measured/onnxruntime {med['measured'] / med['onnxruntime']:.2f}x"
    )
    ort_providers = sides["onnxruntime"].get_providers()
    print(f"onnxruntime providers: {ort_providers}\n")
    return {
        "model": name,
        "providers": providers,
        "session_ms": made_ms,
        "measured": m.to_dict(),
        "medians_ms": med,
        "onnxruntime_providers": ort_providers,
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--providers", default="cuda,cpu")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--budget-ms", type=float, default=2000.0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    providers = [p for p in args.providers.split(",") if p]
    out = []
    cases = [("voice-activity", voice_activity), ("resnet b1", lambda: resnet(1))]
    cases.append(("resnet b8", lambda: resnet(8)))
    for name, make in cases:
        model, feeds = make()
        out.append(one(name, model, feeds, providers, args.runs, args.budget_ms))
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
