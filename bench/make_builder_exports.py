"""Real exports by onnxruntime-genai's model builder, of Qwen2.5 shapes with random weights.

    PYTHONPATH=/tmp/ob:$PYTHONPATH python3 bench/make_builder_exports.py --shape 0.5b \
        --precision fp16,int4 --out /tmp/b [--max-positions 32768]

Writes ``OUT/hf-SHAPE`` (a transformers checkpoint: config and random weights, seed 0) and
``OUT/SHAPE-PRECISION`` (the builder's genai folder: model.onnx, genai_config.json) for
each precision, built for the CUDA execution provider; prints each folder and the seconds it
took. The builder is onnxruntime-genai's (GPU.md: ../shared/gpu/stage_peers.sh stages it).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

#: Qwen2.5 shapes (the published configs' sizes; weights here are random).
SHAPES = {
    "0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
    ),
    "1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
    ),
}


def hf_checkpoint(shape: str, out: Path, max_positions: int) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path = out / f"hf-{shape}"
    if (path / "config.json").is_file():
        return path
    cfg = Qwen2Config(
        vocab_size=151936,
        max_position_embeddings=max_positions,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        torch_dtype="float16",
        **SHAPES[shape],
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(cfg).to(torch.float16)
    model.save_pretrained(path)
    return path


def build(hf: Path, out: Path, precision: str) -> Path:
    target = out / f"{hf.name.removeprefix('hf-')}-{precision}"
    if (target / "model.onnx").is_file():
        return target
    cmd = [
        sys.executable,
        "-m",
        "onnxruntime_genai.models.builder",
        "-i",
        str(hf),
        "-o",
        str(target),
        "-p",
        precision,
        "-e",
        "cuda",
        "-c",
        str(out / "cache"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if not (target / "model.onnx").is_file():
        raise SystemExit(f"the builder made no model.onnx in {target}:\n{done.stderr[-3000:]}")
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="0.5b")
    ap.add_argument("--precision", default="fp16,int4")
    ap.add_argument("--max-positions", type=int, default=32768)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    hf = hf_checkpoint(args.shape, args.out, args.max_positions)
    print(f"{hf} {time.perf_counter() - t0:.0f} s", flush=True)
    for precision in args.precision.split(","):
        t0 = time.perf_counter()
        print(f"{build(hf, args.out, precision)} {time.perf_counter() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
