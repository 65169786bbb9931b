"""Vision and small models on CUDA: onnxep ["cuda","cpu"] beside onnxruntime-gpu and torch.

    python3 bench/gpu_vision.py [--models resnet-small,resnet50,yolo,vad] [--batches 1,8]
        [--dtypes fp32,fp16] [--runs 30] [--providers cuda,cpu] [--tf32 off|on]
        [--real rapidocr-det,magika-v3.3,... --real-dir DIR] [--json OUT.json]

The models are exported here with torch (``torch.onnx.export``, eval mode, so batch norms
fold into the convolutions), float16 ones from the half-precision module on the GPU:

- ``resnet-small``: the factory's ResNet-style CNN (bench/factory/torch_models.py), 3x32x32;
- ``resnet50``: the factory's ResNet-50-sized classifier (bottleneck blocks), 3x224x224;
- ``yolo``: the factory's YOLO-style detector (C2f backbone, SPPF, upsample + concat
  neck, two detection scales), 3x480x480;
- ``vad``: a voice-activity model (Conv1d front end, LSTM, dense head; bench/
  placement_measured.py's), [1, 4000] audio, batch 1 only.

For each (model, batch, dtype): ``sess.run`` with host arrays on both sides, onnxep on
``--providers`` and onnxruntime's CUDAExecutionProvider (imported lazily; without
onnxruntime-gpu on the path that is said) and the torch module itself on CUDA (eager,
cuDNN with its autotuner: the peer on a machine without onnxruntime-gpu), warmed up, then
interleaved, the median of ``--runs`` each; onnxep's ``capture_stats()`` (captures,
replays, the steps that are seams and why) and the largest absolute difference of
onnxep's output from onnxep's CPU provider (batch 1 only unless ``--cpu-diff-all``:
the CPU reference of ResNet-50 at batch 8 costs more than the rest) and from
onnxruntime's. Prints one table row per case (``|`` lines) and writes ``--json``.

``--real`` adds models of the real-model corpus (tests/real_models.py), each a file
``NAME.onnx`` in ``--real-dir`` with the corpus's feeds, beside onnxruntime-gpu (no torch
side: there is no module), first.

float32 numerics are the same on every side: ``--tf32 off`` (the default) runs all of
them in plain float32 (onnxep's default; onnxruntime with ``use_tf32=0``, whose own
default is 1; torch with ``cudnn.allow_tf32`` off), ``--tf32 on`` all of them on TF32
tensor cores (onnxep with ``use_tf32=1``, onnxruntime's default, torch's cuDNN default).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _factory():
    from bench.factory import torch_models as T

    return T


def _resnet_small():
    return _factory().ResNet()


def _resnet50():
    return _factory().ResNet50()


def _yolo():
    return _factory().YoloLike()


def _vad():
    return _factory().VoiceActivity()


#: name -> (builder() -> torch module, input shape without the batch, input name, batches)
MODELS: dict[str, tuple[Callable[[], Any], tuple[int, ...], str, tuple[int, ...] | None]] = {
    "resnet-small": (_resnet_small, (3, 32, 32), "image", None),
    "resnet50": (_resnet50, (3, 224, 224), "image", None),
    "yolo": (_yolo, (3, 480, 480), "image", None),
    "vad": (_vad, (1, 4000), "audio", (1,)),
}


def export(name: str, batch: int, dtype: str) -> tuple[bytes, dict[str, np.ndarray]]:
    """The model's ONNX bytes (a fixed batch) and a seeded input."""
    model, feeds, _ = export_with_module(name, batch, dtype)
    return model, feeds


def export_with_module(name: str, batch: int, dtype: str) -> tuple[bytes, dict, Any]:
    """``export``'s bytes and input, and the torch module they came from (the torch side)."""
    import torch

    make, shape, input_name, _ = MODELS[name]
    torch.manual_seed(0)
    module = make()
    _factory().randomize_batch_norms(module)
    module.eval()
    x = torch.randn(batch, *shape)
    if dtype == "fp16":
        if not torch.cuda.is_available():
            raise SystemExit("fp16 models are exported from the half module on the GPU: no CUDA")
        module, x = module.half().cuda(), x.half().cuda()
    f = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), f, dynamo=False, input_names=[input_name], opset_version=17)
    return f.getvalue(), {input_name: x.detach().cpu().numpy()}, module


def _torch_side(module: Any, feeds: dict[str, np.ndarray], tf32: bool) -> tuple[Any, str]:
    """The same module on torch's CUDA (cuDNN, its autotuner on), host arrays in and out as
    the other sides take them; or (None, why not)."""
    import torch

    if not torch.cuda.is_available():
        return None, "torch has no CUDA device: no torch side"
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    mod = module.cuda()
    (x,) = feeds.values()

    def run() -> list[np.ndarray]:
        with torch.no_grad():
            y = mod(torch.from_numpy(x).cuda())
            y = y[0] if isinstance(y, tuple | list) else y
            return [y.cpu().numpy()]

    return run, ""


def _ort_session(model: bytes, tf32: bool) -> tuple[Any, str]:
    """onnxruntime's CUDA session, or (None, why not)."""
    try:
        import onnxruntime as ort
    except ImportError as exc:
        return None, f"onnxruntime is not importable ({exc}): onnxep timed alone"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return None, (
            f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (put onnxruntime-gpu "
            "on PYTHONPATH): onnxep timed alone"
        )
    options = {"use_tf32": "1" if tf32 else "0"}
    sess = ort.InferenceSession(model, providers=[("CUDAExecutionProvider", options)])
    if sess.get_providers()[0] != "CUDAExecutionProvider":
        return None, f"onnxruntime fell back to {sess.get_providers()}: onnxep timed alone"
    return sess, ""


def _max_abs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0


def one(
    name: str,
    batch: int,
    dtype: str,
    providers: list[str],
    runs: int,
    cpu_diff: bool,
    tf32: bool = False,
):
    t0 = time.perf_counter()
    model, feeds, module = export_with_module(name, batch, dtype)
    export_s = time.perf_counter() - t0
    return measure(name, batch, dtype, model, feeds, module, providers, runs, cpu_diff, tf32,
                   export_s)  # fmt: skip


def measure(
    name: str,
    batch: int,
    dtype: str,
    model: bytes,
    feeds: dict[str, np.ndarray],
    module: Any,
    providers: list[str],
    runs: int,
    cpu_diff: bool,
    tf32: bool = False,
    export_s: float = 0.0,
) -> dict[str, Any]:
    """One case's row: onnxep, onnxruntime-gpu and (with a torch ``module``) torch, timed."""
    import onnxep

    t0 = time.perf_counter()
    tf32_cuda = ("cuda", {"use_tf32": 1})
    chosen: list[Any] = [tf32_cuda if tf32 and p == "cuda" else p for p in providers]
    sess = onnxep.InferenceSession(model, providers=chosen)
    made_s = time.perf_counter() - t0
    ort_sess, ort_why = _ort_session(model, tf32)
    sides: dict[str, Callable[[], Any]] = {"onnxep": lambda: sess.run(None, feeds)}
    if ort_sess is not None:
        sides["onnxruntime"] = lambda: ort_sess.run(None, feeds)
    if module is not None:
        torch_run, torch_why = _torch_side(module, feeds, tf32)
    else:
        torch_run, torch_why = None, "a third party's ONNX file: no torch module"
    if torch_run is not None:
        sides["torch"] = torch_run
    outs = {}
    for k, f in sides.items():
        for _ in range(5):  # warm-up: cuDNN's algorithm search, capture warm-up and capture
            outs[k] = f()[0]
    times: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(runs):
        for k, f in sides.items():
            t = time.perf_counter()
            f()
            times[k].append((time.perf_counter() - t) * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}
    stats = sess.capture_stats()
    plan = sess.capture_plan()
    seams = [] if plan is None else [(r.name, r.op_type, r.reason) for r in plan.seams]
    row: dict[str, Any] = {
        "model": name,
        "batch": batch,
        "dtype": dtype,
        "providers": providers,
        "tf32": tf32,
        "medians_ms": med,
        "ratio": med["onnxep"] / med["onnxruntime"] if "onnxruntime" in med else None,
        "ratio_vs_torch": med["onnxep"] / med["torch"] if "torch" in med else None,
        "torch": torch_why or "torch eager on CUDA (cuDNN, benchmark on)",
        "capture": {k: stats[k] for k in ("captures", "replays", "fallbacks", "segments")},
        "capture_policy": stats.get("policy"),
        "capture_failures": stats.get("failures", []),
        "seams": seams,
        "placement": sess.get_providers(),
        "onnxruntime": ort_why or "CUDAExecutionProvider",
        "export_s": export_s,
        "session_s": made_s,
        "runs": runs,
    }
    if "onnxruntime" in outs:
        row["max_abs_vs_onnxruntime"] = _max_abs(outs["onnxep"], outs["onnxruntime"])
    if cpu_diff:
        cpu = onnxep.InferenceSession(model, providers=["cpu"])
        row["max_abs_vs_cpu"] = _max_abs(outs["onnxep"], cpu.run(None, feeds)[0])
    _print_row(row)
    return row


def real_model(name: str, folder: Path) -> tuple[bytes, dict[str, np.ndarray]]:
    """``folder/NAME.onnx``, a model of the real-model corpus (tests/real_models.py) copied
    there, and the corpus's feeds for it (its dims and values, seeded)."""
    import onnx

    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    import real_models as R

    (model,) = [m for m in R.CORPUS if m.name == name]
    data = (folder / f"{name}.onnx").read_bytes()
    return data, R.feeds(model, onnx.load_from_string(data))


def _print_row(r: dict[str, Any]) -> None:
    med = r["medians_ms"]
    ort = f"{med['onnxruntime']:.3f} ms" if "onnxruntime" in med else "-"
    ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-"
    tor = f"{med['torch']:.3f} ms" if "torch" in med else "-"
    tratio = f"{r['ratio_vs_torch']:.2f}x" if r.get("ratio_vs_torch") is not None else "-"
    cap = r["capture"]
    diff_cpu = r.get("max_abs_vs_cpu")
    diff_ort = r.get("max_abs_vs_onnxruntime")
    print(
        f"| {r['model']} | {r['batch']} | {r['dtype']}{' tf32' if r.get('tf32') else ''} "
        f"| {med['onnxep']:.3f} ms | {ort} | {ratio} "
        f"| {tor} | {tratio} "
        f"| {cap['captures']}/{cap['replays']}/{len(r['seams'])} "
        f"| {'-' if diff_cpu is None else f'{diff_cpu:.3g}'} "
        f"| {'-' if diff_ort is None else f'{diff_ort:.3g}'} |",
        flush=True,
    )
    for name, op, why in r["seams"][:3]:
        print(f"    seam {name} ({op}): {why}", flush=True)
    if len(r["seams"]) > 3:
        print(f"    ... {len(r['seams']) - 3} more seams", flush=True)
    for why in r["capture_failures"][:2]:
        print(f"    capture failure: {why}", flush=True)
    if r["onnxruntime"] != "CUDAExecutionProvider":
        print(f"    {r['onnxruntime']}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--dtypes", default="fp32,fp16")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--providers", default="cuda,cpu")
    ap.add_argument("--cpu-diff-all", action="store_true")
    ap.add_argument("--tf32", choices=("off", "on"), default="off")
    ap.add_argument("--real", default="", help="corpus model names, as NAME.onnx in --real-dir")
    ap.add_argument("--real-dir", type=Path, default=Path(".device/extra/real"))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    providers = [p for p in args.providers.split(",") if p]
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        ap.error(f"unknown models {unknown}; choose from {sorted(MODELS)}")
    batches = [int(b) for b in args.batches.split(",") if b]
    dtypes = [d for d in args.dtypes.split(",") if d]
    if set(dtypes) - {"fp32", "fp16"}:
        ap.error("--dtypes takes fp32 and fp16")
    print(
        "| model | batch | dtype | onnxep | onnxruntime-gpu | ratio | torch | ratio "
        "| captures/replays/seams "
        "| max abs vs onnxep cpu | max abs vs onnxruntime |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for name in [m for m in args.real.split(",") if m]:
        model, feeds = real_model(name, args.real_dir)
        rows.append(measure(name, 1, "file", model, feeds, None, providers, args.runs, True,
                            args.tf32 == "on"))  # fmt: skip
        if args.json is not None:
            args.json.write_text(json.dumps(rows, indent=2))
    for name in names:
        allowed = MODELS[name][3]
        for batch in batches:
            if allowed is not None and batch not in allowed:
                continue
            for dtype in dtypes:
                cpu_diff = batch == 1 or args.cpu_diff_all
                tf32 = args.tf32 == "on"
                rows.append(one(name, batch, dtype, providers, args.runs, cpu_diff, tf32))
                if args.json is not None:  # written as it goes: a timeout keeps what ran
                    args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
