"""Build benchmark models: genai-format or hybrid decoders of a named size, or torch exports.

    python bench/make_models.py --size tiny --dtype fp32 --kind genai --out models/
    python bench/make_models.py --size qwen2.5-1.5b --dtype int4 --kind genai --out models/
    python bench/make_models.py --size tiny --kind hybrid --out models/
    python bench/make_models.py --kind bert --out models/

Writes ``DIR/<kind>-<size>-<dtype>/model.onnx`` (weights in ``model.onnx.data``
beside it) and prints the path; random weights from ``--seed``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ is imported from the root

from bench.factory import HYBRID_SIZES, SIZES  # noqa: E402

KINDS = ("genai", "hybrid", "llama", "resnet", "bert")


def build(kind: str, size: str, dtype: str, out: Path, seed: int, positions: str) -> Path:
    if kind == "genai":
        from bench.factory import build_genai_decoder

        path = out / f"genai-{size}-{dtype}" / "model.onnx"
        build_genai_decoder(size, seed=seed, dtype=dtype, out_path=path)
    elif kind == "hybrid":
        from bench.factory import build_hybrid_decoder

        path = out / f"hybrid-{size}-{dtype}" / "model.onnx"
        build_hybrid_decoder(size, seed=seed, dtype=dtype, out_path=path, positions=positions)
    else:
        # torch exports: fixed small sizes, fp32, seed 0
        from bench.factory import torch_models

        path = out / f"{kind}.onnx"
        out.mkdir(parents=True, exist_ok=True)
        getattr(torch_models, f"export_{kind}")(path)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kind", choices=KINDS, default="genai")
    sizes = sorted(set(SIZES) | set(HYBRID_SIZES))
    p.add_argument("--size", default="tiny", help=f"one of {', '.join(sizes)}")
    p.add_argument("--dtype", choices=("fp32", "fp16", "int4", "int8"), default="fp32")
    p.add_argument("--positions", choices=("2d", "3d"), default="2d", help="hybrid rotary input")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="folder to write into")
    args = p.parse_args(argv)
    table = HYBRID_SIZES if args.kind == "hybrid" else SIZES
    if args.kind in ("genai", "hybrid") and args.size not in table:
        p.error(f"--size for --kind {args.kind}: one of {', '.join(table)}")
    t0 = time.perf_counter()
    path = build(args.kind, args.size, args.dtype, args.out, args.seed, args.positions)
    print(f"wrote {path} in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
