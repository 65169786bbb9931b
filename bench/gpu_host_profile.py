"""Where the host's time goes in an eager CUDA run: cProfile over prefills and decode steps.

    python bench/gpu_host_profile.py [--make qwen2.5-0.5b:fp16] [--length 128] [--runs 10]
        [--steps 32] [--top 40] [--providers cuda,cpu] [--out DIR] [--walls-only]

The prompt's prefill (as ``onnxep.generate`` runs it, capture off) and eager decode steps
(capture off: every kernel launched from Python) of a factory genai decoder, each warmed
up, then profiled; prints the wall time per run beside the device time the CUDA events
measure, and the functions with the most own time (``tottime``) and the most inclusive
time, so the host cost per op can be split into its parts (dispatch, argument packing,
CuPy's launch path, cuBLAS through ctypes, allocation). ``--out`` keeps the .pstats files.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_prefill_profile import _prompt, make_model, onnxep_session, vocabulary  # noqa: E402


def _report(name: str, prof: cProfile.Profile | None, runs: int, wall_ms: float, top: int, out):
    if prof is None:
        print(f"## {name}: {wall_ms:.3f} ms a run (median of {runs})")
        return
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s)
    st.sort_stats("tottime").print_stats(top)
    st.sort_stats("cumulative").print_stats(top)
    print(f"## {name}: {wall_ms:.3f} ms a run (median of {runs}, unprofiled)")
    print(s.getvalue())
    if out is not None:
        st.dump_stats(str(out / f"{name}.pstats"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--make", default="qwen2.5-0.5b:fp16")
    ap.add_argument("--models-dir", type=Path, default=Path("/tmp/m"))
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--providers", default="cuda,cpu")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--walls-only", action="store_true")
    args = ap.parse_args(argv)
    from onnxep.generation.greedy import GreedyDecoder

    model = make_model(args.make, args.models_dir)
    sess = onnxep_session(model, [p for p in args.providers.split(",") if p])
    prompt = _prompt(vocabulary(model), args.length)

    def prefill() -> None:
        GreedyDecoder(sess, prompt, 1).step()

    for _ in range(3):
        prefill()
    walls = []
    for _ in range(args.runs):
        t = time.perf_counter()
        prefill()
        walls.append((time.perf_counter() - t) * 1e3)
    prof = None if args.walls_only else cProfile.Profile()
    if prof is not None:
        prof.enable()
        for _ in range(args.runs):
            prefill()
        prof.disable()
    walls.sort()
    _report(f"prefill-{args.length}", prof, args.runs, walls[len(walls) // 2], args.top, args.out)

    dec = GreedyDecoder(sess, prompt, args.steps * 2 + 4)
    for _ in range(4):
        dec.step()
    walls = []
    for _ in range(args.steps):
        t = time.perf_counter()
        dec.step()
        walls.append((time.perf_counter() - t) * 1e3)
    prof = None if args.walls_only else cProfile.Profile()
    if prof is not None:
        prof.enable()
        for _ in range(args.steps):
            dec.step()
        prof.disable()
    walls.sort()
    _report("decode-eager", prof, args.steps, walls[len(walls) // 2], args.top, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
