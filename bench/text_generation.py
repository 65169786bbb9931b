"""What the text layer costs: onnxep.Generator greedy and sampled against the bare token decode.

    python bench/text_generation.py --size qwen2.5-0.5b --dtype fp16 --providers cuda,cpu
    python bench/text_generation.py --size tiny --providers cpu --tokens 16

Builds a factory genai decoder into a temporary folder (random weights, a
genai_config.json with its head size and no end id, so every run makes
``--tokens`` tokens), then runs, interleaved, ``--repeats`` times each:
``onnxep.generate`` on token ids (the greedy decode alone: the peer),
``Generator`` greedy, sampled (temperature 0.8, top-k 50, top-p 0.9) and
with a repetition penalty, and a batch of four prompts of different
lengths. Prints each one's tokens/s from its median decode step (the
Generator's step includes choosing the token and the text) and the ratio to
the peer, with the time to the first token (the peer's: its prefill run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ is imported from the root

from bench.factory import SIZES, build_genai_decoder  # noqa: E402

SAMPLED = dict(do_sample=True, temperature=0.8, top_k=50, top_p=0.9, seed=0)


def build(size: str, dtype: str, folder: Path) -> Path:
    cfg = SIZES[size]
    build_genai_decoder(size, seed=0, dtype=dtype, out_path=folder / "model.onnx")
    genai = {
        "model": {
            "context_length": 4096,
            "eos_token_id": [],
            "pad_token_id": 0,
            "vocab_size": cfg.vocab,
            "decoder": {"filename": "model.onnx", "head_size": cfg.head_dim},
        },
        "search": {"max_length": 4096, "do_sample": False},
    }
    (folder / "genai_config.json").write_text(json.dumps(genai))
    return folder


def main(argv: list[str] | None = None) -> int:
    import onnxep

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="tiny", choices=sorted(SIZES))
    p.add_argument("--dtype", default="fp32", choices=("fp32", "fp16", "int4"))
    p.add_argument("--providers", default="cpu")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--prompt", type=int, default=32, help="prompt length in tokens")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    providers = args.providers.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        folder = build(args.size, args.dtype, Path(tmp))
        gen = onnxep.Generator(folder, providers=providers)
        vocab = SIZES[args.size].vocab
        rng = np.random.default_rng(0)
        ids = rng.integers(0, vocab, args.prompt).tolist()
        batch = [rng.integers(0, vocab, n).tolist() for n in (args.prompt, 5, args.prompt // 2, 9)]
        n = args.tokens

        # the same statistic on every side: the median wall ms of a decode step (the
        # generator's includes choosing the token and the text), and the prefill's
        def peer() -> tuple[float, float]:
            r = onnxep.generate(gen.session, ids, n, progress=False)
            return 1000.0 / statistics.median(r.step_ms[1:]), r.step_ms[0]

        def text(**opts) -> tuple[float, float]:
            s = gen.generate(ids, max_new_tokens=n, **opts).stats
            return 1000.0 / statistics.median(s.step_ms[1:]), s.time_to_first_token_ms

        def ragged() -> tuple[float, float]:
            rows = gen.generate(batch, max_new_tokens=n)
            s = rows[0].stats
            return len(rows) * 1000.0 / statistics.median(s.step_ms[1:]), s.time_to_first_token_ms

        sides = {
            "generate (token ids, greedy): peer": peer,
            "Generator greedy": text,
            "Generator sampled": lambda: text(**SAMPLED),
            "Generator repetition penalty 1.2": lambda: text(repetition_penalty=1.2),
            "Generator batch of 4, ragged (all rows)": ragged,
        }
        for fn in sides.values():  # warm-up: plans, kernels, capture
            fn()
        samples: dict[str, list[tuple[float, float]]] = {k: [] for k in sides}
        for _ in range(args.repeats):
            for name, fn in sides.items():
                samples[name].append(fn())
        t = time.strftime("%Y-%m-%d %H:%M")
        print(
            f"{args.size} {args.dtype} on {gen.session.get_providers()[0]}: {args.prompt}-token "
            f"prompt, {n} new tokens, median of {args.repeats} ({t})"
        )
        base = statistics.median(s[0] for s in samples[next(iter(sides))])
        for name, got in samples.items():
            rate = statistics.median(s[0] for s in got)
            ttft = statistics.median(s[1] for s in got)
            print(f"  {name:42s} {rate:9.1f} tok/s  x{rate / base:5.2f}  first {ttft:7.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
