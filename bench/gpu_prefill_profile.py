"""Where a decoder's prefill goes, op type by op type, beside onnxruntime in the same process.

    python bench/gpu_prefill_profile.py [MODEL ...] [--make qwen2.5-0.5b:fp16 ...]
        [--lengths 128,512,2000,8000] [--repeats 3] [--vs onnxruntime] [--steps 32]
        [--tokens-at 2000,8000] [--providers cuda,cpu] [--models-dir /tmp/m] [--json out.jsonl]

Models are genai-format decoders (onnxruntime-genai's builder exports, or the factory's,
built with ``--make SIZE:DTYPE`` into ``--models-dir`` when not there yet). Per model and
prompt length, JSON lines:

* ``prefill``: onnxep's warm prefill as ``onnxep.generate`` runs it (the first step of a
  GreedyDecoder: prompt in, one token id back; capture off, as a prompt runs once), the
  median of ``--repeats`` after a warm-up; beside it onnxruntime's (``--vs onnxruntime``:
  IO binding with the logits left on its device, so neither side pays for copying them);
* ``ops``: onnxep's time per op type in one profiled prefill (the session's profiler
  times each step after synchronising, so the sum exceeds the unprofiled wall time by the
  host's share), heaviest first, and, where torch with CUDA is installed, ``kernels``: the
  CUDA kernels of one unprofiled prefill by device time (CUPTI through torch.profiler);
* ``decode`` (for each ``--tokens-at`` length that is also in ``--lengths``): the greedy
  tokens of ``--steps`` steps after the prompt on both sides, whether they are equal, and
  device memory after them: onnxep's pool (used and held) and, for both sides, the
  device's used memory above what it was before the side's session was created.

``--providers cpu`` runs the same on the CPU provider (a dry run of this script on a
machine without a GPU).
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ is imported from the root


def _device_used(cupy: Any) -> int | None:
    if cupy is None:
        return None
    free, total = cupy.cuda.runtime.memGetInfo()
    return int(total - free)


def _prompt(vocab: int, length: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, min(vocab, 32000), (1, length)).astype(np.int64)


def onnxep_session(model: str, providers: list[str], profile: bool = False):
    import onnxep

    opts = onnxep.SessionOptions(enable_profiling=profile)
    provs = [("cuda", {"capture": "off"}) if p == "cuda" else p for p in providers]
    return onnxep.InferenceSession(model, sess_options=opts, providers=provs)


def onnxep_prefill_ms(sess: Any, prompt: np.ndarray) -> float:
    """One prefill as generate runs it: ids in, the token id back on the host."""
    from onnxep.generate import GreedyDecoder

    dec = GreedyDecoder(sess, prompt, 1)
    dec.step()
    return dec.result.step_ms[0]


def op_times(sess: Any, prompt: np.ndarray) -> list[dict[str, Any]]:
    """Milliseconds per op type of one profiled prefill (after a warm-up one)."""
    onnxep_prefill_ms(sess, prompt)
    start = len(sess.profiler.events)
    onnxep_prefill_ms(sess, prompt)
    per: dict[str, list[float]] = collections.defaultdict(list)
    for e in sess.profiler.events[start:]:
        if e["cat"] == "Node":
            per[e["args"].get("op_type", "?")].append(e["dur"])
    total = sum(sum(v) for v in per.values())
    rows = sorted(per.items(), key=lambda kv: -sum(kv[1]))
    return [
        {"op": op, "count": len(d), "ms": round(sum(d) / 1e3, 3),
         "share": round(sum(d) / total, 3) if total else None}
        for op, d in rows
    ]  # fmt: skip


def kernel_times(sess: Any, prompt: np.ndarray, top: int = 12) -> dict[str, Any] | None:
    """The CUDA kernels of one prefill by device time (CUPTI), where torch has CUDA."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    onnxep_prefill_ms(sess, prompt)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        onnxep_prefill_ms(sess, prompt)
        torch.cuda.synchronize()
    per: dict[str, list[float]] = collections.defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name].append(float(e.time_range.elapsed_us()))
    rows = sorted(per.items(), key=lambda kv: -sum(kv[1]))
    return {
        "total_ms": round(sum(sum(v) for v in per.values()) / 1e3, 3),
        "launches": sum(len(v) for v in per.values()),
        "top": [{"kernel": k[:90], "launches": len(v), "ms": round(sum(v) / 1e3, 3)}
                for k, v in rows[:top]],
    }  # fmt: skip


class OrtPrefill:
    """onnxruntime's prefill through IO binding: host ids in, outputs left on its device."""

    def __init__(self, model: str) -> None:
        import onnxruntime as ort

        avail = ort.get_available_providers()
        provs = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in avail]
        self.session = ort.InferenceSession(model, providers=provs)
        self.providers = self.session.get_providers()
        self.device = "cuda" if self.providers[0] == "CUDAExecutionProvider" else "cpu"
        self.version = ort.__version__

    def feeds(self, prompt: np.ndarray, dims: dict[str, int]) -> dict[str, np.ndarray]:
        from onnxep.benchmark.decode import DecodeState, decode_spec

        spec = decode_spec(self.session.get_inputs(), self.session.get_outputs())
        return DecodeState(spec, prompt.shape[1], prompt=prompt, dims=dims).feeds()

    def prefill_ms(self, feeds: dict[str, np.ndarray]) -> float:
        io = self.session.io_binding()
        for name, value in feeds.items():
            io.bind_cpu_input(name, value)
        for out in self.session.get_outputs():
            io.bind_output(out.name, self.device)
        t0 = time.perf_counter()
        self.session.run_with_iobinding(io)
        io.synchronize_outputs()
        return (time.perf_counter() - t0) * 1000.0


def ort_tokens(model: str, prompt: np.ndarray, steps: int, dims: dict[str, int], cupy: Any):
    """onnxruntime's greedy tokens (host feeds, the bench's own loop) from a fresh session,
    and the device memory in use when they are done."""
    from onnxep.benchmark.decode import decode_spec
    from onnxep.benchmark.sides import OrtSide

    side = OrtSide(model, want_cuda=True)
    spec = decode_spec(side.session.get_inputs(), side.session.get_outputs())
    names = [o.name for o in side.session.get_outputs()]
    loop = side.decode_loop(spec, prompt, steps, dims, names)
    while not loop.done:
        loop.step()
    return list(loop.tokens), _device_used(cupy), side.session.get_providers()[0]


def make_model(spec: str, models_dir: Path) -> str:
    """``SIZE:DTYPE`` of the factory's genai decoders, built once into ``models_dir``."""
    size, _, dtype = spec.partition(":")
    path = models_dir / f"genai-{size}-{dtype or 'fp16'}" / "model.onnx"
    if not path.is_file():
        from bench.make_models import build

        build("genai", size, dtype or "fp16", models_dir, 0, "2d")
    return str(path)


def vocabulary(model: str) -> int:
    """The logits' last dimension (prompt ids are drawn below it), from the graph alone."""
    import onnx

    graph = onnx.load(model, load_external_data=False).graph
    out = next((o for o in graph.output if o.name == "logits"), graph.output[0])
    dim = out.type.tensor_type.shape.dim[-1]
    return dim.dim_value if dim.HasField("dim_value") else 32000


def _free(cupy: Any) -> None:
    gc.collect()
    if cupy is not None:
        cupy.get_default_memory_pool().free_all_blocks()


def profile_model(model: str, args: argparse.Namespace, emit) -> None:
    """Every figure for one model; each side's memory from a fresh session of its own."""
    from onnxep.benchmark.decode import model_dims

    cupy = None
    if "cuda" in args.providers:
        import cupy
    dims = model_dims(model)
    args.vocab = vocabulary(model)
    theirs: dict[int, tuple[float, str]] = {}
    vs = args.vs
    if vs == "onnxruntime" and cupy is not None:
        import onnxruntime

        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            # a CPU peer is no figure to set a GPU's beside (and takes minutes at 8000 tokens)
            emit({"bench": "peer", "skipped": f"onnxruntime {onnxruntime.__version__} has no "
                  "CUDAExecutionProvider here: install onnxruntime-gpu "
                  "(../shared/gpu/stage_peers.sh)"})  # fmt: skip
            vs = "none"
    if vs == "onnxruntime":
        ort = OrtPrefill(model)
        for length in args.lengths:
            feeds = ort.feeds(_prompt(args.vocab, length), dims)
            ort.prefill_ms(feeds)
            ms = statistics.median(ort.prefill_ms(feeds) for _ in range(args.repeats))
            theirs[length] = (ms, f"{ort.version} {ort.providers[0]}")
        del ort
        _free(cupy)
    sess = onnxep_session(model, args.providers)
    prof = onnxep_session(model, args.providers, profile=True)
    for length in args.lengths:
        prompt = _prompt(args.vocab, length)
        onnxep_prefill_ms(sess, prompt)  # warm-up: plans, pool blocks
        ours = statistics.median(onnxep_prefill_ms(sess, prompt) for _ in range(args.repeats))
        row: dict[str, Any] = {
            "bench": "prefill", "model": model, "length": length,
            "providers": args.providers, "onnxep_ms": round(ours, 3),
        }  # fmt: skip
        if length in theirs:
            ms, who = theirs[length]
            row.update(onnxruntime_ms=round(ms, 3), onnxruntime=who, ratio=round(ours / ms, 2))
        emit(row)
        emit({"bench": "prefill_ops", "model": model, "length": length,
              "ops": op_times(prof, prompt)})  # fmt: skip
        if cupy is not None and not args.no_kernels:
            k = kernel_times(sess, prompt)
            if k is not None:
                emit({"bench": "prefill_kernels", "model": model, "length": length, **k})
    del sess, prof
    _free(cupy)
    for length in args.tokens_at:
        import onnxep

        prompt = _prompt(args.vocab, length, seed=1)
        row = {"bench": "decode", "model": model, "length": length, "steps": args.steps}
        if vs == "onnxruntime":
            base = _device_used(cupy)
            tokens, used, who = ort_tokens(model, prompt, args.steps, dims, cupy)
            row.update(onnxruntime_tokens=tokens, onnxruntime=who)
            if used is not None:
                row["onnxruntime_device_mb"] = round((used - base) / 2**20, 1)
            _free(cupy)
        base = _device_used(cupy)
        sess = onnxep_session(model, args.providers)
        result = onnxep.generate(sess, prompt, args.steps, progress=False)
        row["onnxep_tokens"] = result.tokens
        if "onnxruntime_tokens" in row:
            row["tokens_equal"] = row["onnxruntime_tokens"] == result.tokens
        pool = getattr(sess.providers[0], "pool", None)
        if pool is not None:
            row.update(onnxep_pool_used_mb=round(pool.used_bytes() / 2**20, 1),
                       onnxep_pool_held_mb=round(pool.total_bytes() / 2**20, 1))  # fmt: skip
        used = _device_used(cupy)
        if used is not None:
            row["onnxep_device_mb"] = round((used - base) / 2**20, 1)
            if "onnxruntime_device_mb" in row:
                row["device_mb_ratio"] = round(
                    row["onnxep_device_mb"] / row["onnxruntime_device_mb"], 3
                )
        del sess, result
        _free(cupy)
        emit(row)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*")
    p.add_argument("--make", action="append", default=[], help="SIZE:DTYPE factory decoder")
    p.add_argument("--models-dir", type=Path, default=Path("/tmp/m"))
    p.add_argument("--lengths", default="128,512,2000,8000")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--vs", choices=["none", "onnxruntime"], default="none")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--tokens-at", default="2000,8000")
    p.add_argument("--providers", default="cuda,cpu")
    p.add_argument("--no-kernels", action="store_true", help="skip the CUPTI kernel table")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    try:
        a.lengths = [int(x) for x in a.lengths.split(",")]
        a.tokens_at = [int(x) for x in a.tokens_at.split(",") if x]
    except ValueError:
        p.error("--lengths and --tokens-at are comma-separated token counts")
    if min(a.lengths) < 1 or a.repeats < 1 or a.steps < 1:
        p.error("--lengths, --repeats and --steps must be positive")
    a.providers = a.providers.split(",")
    models = list(a.models) + [make_model(m, a.models_dir) for m in a.make]
    if not models:
        p.error("give a MODEL path or --make SIZE:DTYPE")
    sink = a.json.open("w") if a.json else None

    def emit(row):
        line = json.dumps(row)
        print(line, flush=True)
        if sink:
            sink.write(line + "\n")

    for model in models:
        profile_model(model, a, emit)
    if sink:
        sink.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
