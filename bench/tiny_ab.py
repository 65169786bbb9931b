"""The small run_all rows (per-node cost bound) against onnxruntime, interleaved, several rounds.

    python bench/tiny_ab.py [--only hybrid genai ...] [--rounds 3] [--runs 60]

Each round is one `onnxep.tools.benchmark.bench` call (onnxep and onnxruntime
alternating on the same feeds); the ratio printed is onnxep's median over
onnxruntime's from that same call, so machine noise between rounds cancels.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from onnxep.tools.benchmark import bench  # noqa: E402

DATA = ROOT / "tests" / "data"
ROWS = {
    "hybrid": (("hybrid", "tiny", "fp32"), dict(decode=32, context=16)),
    "genai": (("genai", "tiny", "fp32"), dict(decode=32, context=16)),
    "qwen2_int4": (DATA / "genai" / "qwen2_int4" / "model.onnx", dict(decode=32, context=16)),
    "qwen2_fp32": (DATA / "genai" / "qwen2_fp32" / "model.onnx", dict(decode=32, context=16)),
    "hf_llama": (DATA / "hf_llama.onnx", dict(dims={"batch": 1, "seq": 7})),
    "llama_kv": (DATA / "llama_kv.onnx", dict(dims={"batch": 1, "seq": 8, "past": 16})),
}


def model_path(spec, scratch: Path) -> Path:
    if isinstance(spec, tuple):
        from bench.make_models import build

        kind, size, dtype = spec
        return build(kind, size, dtype, scratch, 0, "2d")
    return spec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=list(ROWS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=60)
    a = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="tiny_ab_"))
    for name in a.only:
        spec, kw = ROWS[name]
        path = model_path(spec, scratch)
        ratios = []
        for _ in range(a.rounds):
            r = bench(str(path), vs=["onnxruntime"], runs=a.runs, progress=False, **kw)
            ours, theirs = r.summary["onnxep"]["median_ms"], r.summary["onnxruntime"]["median_ms"]
            ratios.append(ours / theirs)
            print(f"{name:12s} onnxep {ours:.3f} ms, ort {theirs:.3f} ms, {ratios[-1]:.2f}x")
        ratios.sort()
        print(f"{name:12s} median ratio {ratios[len(ratios) // 2]:.2f}x over {a.rounds} rounds")


if __name__ == "__main__":
    main()
