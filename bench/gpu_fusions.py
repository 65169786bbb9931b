"""Fusions off against on, in the same run: kernels launched, plan nodes and ms per decode step.

    python bench/gpu_fusions.py OUT.json [--providers cuda,cpu] [--steps 32] [--budget 140]

For each decoder (the torch exports in tests/data, the factory's genai
qwen2.5-0.5b fp16 and int4 where ``gpu_check.sh decode`` left them under
/tmp/m, else the factory's tiny genai decoders built into a temp dir) and
each capture mode ("off": eager, "auto": CUDA graphs), two sessions - every
fusion switched off, and every fusion on - decode the same greedy tokens with
their steps interleaved (``onnxep.generate``'s GreedyDecoder, as ``onnxep
bench --decode`` does). Per case it prints one JSON line and, at the end,
writes all of them to OUT.json:

- ``ms_per_step``: median wall ms of the timed steps (token on the host);
- ``plan_nodes``: nodes in the session's plan after its rewrites;
- ``kernels_per_step``: the CUDA kernels CUPTI saw per step (through
  ``torch.profiler``, which sees every library's launches, and each kernel a
  replayed graph runs), over a few steps after the timed ones; where CUPTI is
  not reachable, a captured decode's graph kernel nodes, else null with why;
- ``graph_kernel_nodes`` (captured decodes): kernel nodes of the graphs the
  decode replays (``cuGraphGetNodes`` on the graphs CuPy captured; seams run
  outside them);
- ``capture``: captures, replays, fallbacks (and the policy) over the decode;
- ``tokens_agree``: whether fusions off and on chose the same tokens.

Cases run most important first and stop, with a message, when ``--budget``
seconds are spent. ``--providers cpu`` runs the same on the CPU provider
(capture "off" only; no kernel counts): how CI checks this script.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
QWEN = Path("/tmp/m")
#: decode steps dropped before timing: a captured decode captures on its first steps
SETTLE = 2
#: eager steps profiled for the kernel count (after the timed ones)
PROFILED = 2
_KERNEL_NODE, _CHILD_GRAPH_NODE = 0, 4  # CUgraphNodeType


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="JSON file to write every case into")
    ap.add_argument("--providers", default="cuda,cpu", help="comma-separated, in priority order")
    ap.add_argument("--steps", type=int, default=32, help="timed decode steps per side (>= 1)")
    ap.add_argument("--prompt", type=int, default=8, help="prompt tokens")
    ap.add_argument("--budget", type=float, default=140.0, help="seconds for all cases")
    ap.add_argument("--captures", default=None, help="capture modes (default: off,auto on cuda)")
    ap.add_argument("--models", default=None, help="comma-separated model paths (default: all)")
    args = ap.parse_args(argv)
    args.providers = [p.strip() for p in args.providers.split(",") if p.strip()]
    if not args.providers:
        ap.error("--providers names no provider")
    if args.steps < 1:
        ap.error(f"--steps must be at least 1, got {args.steps}")
    if args.prompt < 1:
        ap.error(f"--prompt must be at least 1, got {args.prompt}")
    cuda = any("cuda" in p.lower() for p in args.providers)
    modes = args.captures.split(",") if args.captures else (["off", "auto"] if cuda else ["off"])
    bad = [m for m in modes if m not in ("off", "auto", "whole", "segmented")]
    if bad:
        ap.error(f"--captures: unknown mode(s) {bad}; use off, auto, whole or segmented")
    if not cuda and modes != ["off"]:
        ap.error("--captures other than off needs the cuda provider in --providers")
    args.captures = modes
    return args


def models(args: argparse.Namespace, tmp: Path) -> tuple[list[tuple[str, Path]], list[str]]:
    """(name, path) of each decoder to run, and a message for each one replaced or absent."""
    if args.models:
        paths = [Path(m) for m in args.models.split(",") if m]
        return [(p.parent.name if p.stem == "model" else p.stem, p) for p in paths], []
    from bench.factory import build_genai_decoder

    notes: list[str] = []
    found = [(name, DATA / f"{name}.onnx") for name in ("hf_llama_kv", "llama_kv")]
    for dtype in ("fp16", "int4"):
        big = QWEN / f"genai-qwen2.5-0.5b-{dtype}" / "model.onnx"
        if big.exists():
            found.append((f"genai-qwen2.5-0.5b-{dtype}", big))
            continue
        notes.append(f"{big} absent (gpu_check.sh decode builds it): the tiny {dtype} one instead")
        path = tmp / f"genai-tiny-{dtype}" / "model.onnx"
        build_genai_decoder("tiny", seed=0, dtype=dtype, out_path=path)
        found.append((f"genai-tiny-{dtype}", path))
    return found, notes


def _providers(names: list[str], capture: str) -> list[Any]:
    return [(p, {"capture": capture}) if "cuda" in p.lower() else p for p in names]


def _session(path: Path, providers: list[Any], fused: bool) -> Any:
    import onnxep
    from onnxep.providers.fusions import standard_fusions

    off = [] if fused else sorted({p.name for p in standard_fusions()})
    options = onnxep.SessionOptions(disabled_rewrites=off)
    return onnxep.InferenceSession(str(path), options, providers=providers)


def _fired(sess: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for f in sess.placement().fusions:
        out[f.name] = out.get(f.name, 0) + f.fired
    return {k: v for k, v in sorted(out.items()) if v}


# -- counting kernels --------------------------------------------------------------------


def _graph_kernels(graph_ptr: int, lib: Any) -> int:
    """Kernel nodes of one CUDA graph, child graphs included."""
    n = ctypes.c_size_t(0)
    handle = ctypes.c_void_p(graph_ptr)
    if lib.cuGraphGetNodes(handle, None, ctypes.byref(n)) != 0:
        raise RuntimeError("cuGraphGetNodes failed")
    nodes = (ctypes.c_void_p * n.value)()
    if n.value and lib.cuGraphGetNodes(handle, nodes, ctypes.byref(n)) != 0:
        raise RuntimeError("cuGraphGetNodes failed")
    count = 0
    for node in nodes:
        kind = ctypes.c_int(-1)
        lib.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind))
        if kind.value == _KERNEL_NODE:
            count += 1
        elif kind.value == _CHILD_GRAPH_NODE:
            child = ctypes.c_void_p()
            lib.cuGraphChildGraphNodeGetGraph(ctypes.c_void_p(node), ctypes.byref(child))
            count += _graph_kernels(child.value, lib)
    return count


def captured_kernels(sess: Any) -> tuple[int | None, str]:
    """Kernel nodes in the graphs of the capture-cache entry replayed last, and how counted."""
    runner = getattr(sess, "_capture", None)
    cache = getattr(runner, "_cache", None)
    if not cache:
        return None, "no captured graph"
    entry = next(reversed(cache.values()))  # replays move their entry to the end
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        total = sum(_graph_kernels(int(g.graph), lib) for g in entry.graphs.values())
    except Exception as exc:
        return None, f"graph nodes not counted: {type(exc).__name__}: {exc}"
    return total, f"kernel nodes in {len(entry.graphs)} captured graph(s)"


class KernelProfiler:
    """CUDA kernels launched while inside, from CUPTI through torch.profiler (every library's)."""

    def __init__(self) -> None:
        self.why = ""
        try:
            import torch
            from torch.profiler import ProfilerActivity, profile

            if not torch.cuda.is_available():
                raise RuntimeError("torch sees no CUDA device")
            self._torch, self._profile = torch, profile
            self._activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        except Exception as exc:
            self._torch = None
            self.why = f"no CUPTI through torch.profiler: {type(exc).__name__}: {exc}"

    @property
    def available(self) -> bool:
        return self._torch is not None

    def count(self, steps: Any, sync: Any) -> int:
        with self._profile(activities=self._activities) as prof:
            steps()
            sync()
            self._torch.cuda.synchronize()
        kinds = self._torch.autograd.DeviceType
        names = [e.name for e in prof.events() if e.device_type == kinds.CUDA]
        return sum(1 for n in names if not n.startswith(("Memcpy", "Memset")))


# -- one case ----------------------------------------------------------------------------


def _sync(sess: Any) -> None:
    for p in sess.providers:
        fn = getattr(p, "synchronize", None)
        if fn is not None:
            fn()


def interleaved_decoders(
    sides: dict[str, Any], prompt: Any, tokens: int, capacity: int, steps: int
) -> dict[str, Any]:
    """Per session, a greedy decoder of ``tokens`` tokens after a warm-up decode, then
    ``steps`` of their steps interleaved, one of each in turn; each step returns with the
    device idle (``pipeline=False``), so each session is timed and counted alone."""
    from onnxep.generation.greedy import GreedyDecoder

    decoders = {}
    for key, sess in sides.items():
        warm = GreedyDecoder(sess, prompt, 1 + SETTLE, capacity=capacity, pipeline=False)
        while not warm.done:
            warm.step()
        decoders[key] = GreedyDecoder(sess, prompt, tokens, capacity=capacity, pipeline=False)
    for _ in range(steps):
        for d in decoders.values():
            d.step()
    return decoders


def run_case(
    name: str, path: Path, args: argparse.Namespace, capture: str, profiler: KernelProfiler | None
) -> dict[str, Any]:
    providers = _providers(args.providers, capture)
    sides = {"off": _session(path, providers, False), "on": _session(path, providers, True)}
    prompt = np.random.default_rng(0).integers(1, 100, args.prompt)
    profiled = PROFILED if profiler is not None and profiler.available else 0
    tokens = 1 + SETTLE + args.steps + profiled
    capacity = args.prompt + tokens
    decoders = interleaved_decoders(sides, prompt, tokens, capacity, 1 + SETTLE + args.steps)
    case: dict[str, Any] = {"model": name, "path": str(path), "capture": capture}
    case["providers"] = [p if isinstance(p, str) else p[0] for p in providers]
    for key, d in decoders.items():
        sess = sides[key]
        side: dict[str, Any] = {"plan_nodes": len(sess.placement()), "fired": _fired(sess)}
        if capture != "off":
            side["graph_kernel_nodes"], side["graph_note"] = captured_kernels(sess)
        if profiled:
            side["kernels_per_step"] = profiler.count(
                lambda d=d: [d.step() for _ in range(profiled)], lambda s=sess: _sync(s)
            ) / float(profiled)
            side["kernels_counted"] = "CUDA kernels CUPTI saw (torch.profiler), seams included"
        elif capture != "off":
            side["kernels_per_step"] = side["graph_kernel_nodes"]
            side["kernels_counted"] = f"{side['graph_note']} (seams not counted)"
        else:
            side["kernels_per_step"] = None
            side["kernels_counted"] = profiler.why if profiler is not None else "no CUDA provider"
        r = d.finish()
        timed = r.step_ms[1 + SETTLE : 1 + SETTLE + args.steps]
        side["ms_per_step"] = round(float(np.median(timed)), 4)
        side["timed_steps"] = len(timed)
        side["state_path"] = r.state_path
        stats = r.capture_stats or {}
        side["capture"] = {k: stats.get(k) for k in ("captures", "replays", "fallbacks", "policy")}
        side["tokens"] = r.tokens
        case[key] = side
    off, on = case["off"]["tokens"], case["on"]["tokens"]
    case["tokens_agree"] = off == on
    case["first_divergence"] = next((i for i, (a, b) in enumerate(zip(off, on)) if a != b), None)
    return case


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(ROOT))
    t0 = time.perf_counter()
    cases: list[dict[str, Any]] = []
    cuda = any("cuda" in p.lower() for p in args.providers)
    profiler = KernelProfiler() if cuda else None
    with tempfile.TemporaryDirectory(prefix="gpu_fusions_") as tmp:
        found, notes = models(args, Path(tmp))
        for note in notes:
            print(json.dumps({"note": note}), flush=True)
        for capture in args.captures:
            for name, path in found:
                elapsed = time.perf_counter() - t0
                if elapsed > args.budget:
                    case = {"model": name, "capture": capture, "skipped": "budget spent"}
                else:
                    try:
                        case = run_case(name, path, args, capture, profiler)
                    except Exception as exc:
                        case = {"model": name, "capture": capture, "error": f"{exc!r}"[:400]}
                case["elapsed_s"] = round(time.perf_counter() - t0, 1)
                print(json.dumps(_brief(case)), flush=True)
                cases.append(case)
    Path(args.out).write_text(json.dumps({"notes": notes, "cases": cases}, indent=1))
    for line in table(cases):
        print(line)
    return 0 if all("error" not in c for c in cases) else 1


def table(cases: list[dict[str, Any]]) -> list[str]:
    """One line per case: fusions off -> on for ms, kernels and nodes per step."""
    lines = ["# model capture: ms/step off->on | kernels/step off->on | plan nodes | tokens"]
    for c in cases:
        head = f"# {c['model']} {c['capture']}:"
        if "off" not in c:
            lines.append(f"{head} {c.get('skipped') or c.get('error')}")
            continue
        off, on = c["off"], c["on"]
        agree = "agree" if c["tokens_agree"] else f"DIFFER at {c['first_divergence']}"
        lines.append(
            f"{head} {off['ms_per_step']}->{on['ms_per_step']} ms | "
            f"{off['kernels_per_step']}->{on['kernels_per_step']} | "
            f"{off['plan_nodes']}->{on['plan_nodes']} | {agree}"
        )
    return lines


def _brief(case: dict[str, Any]) -> dict[str, Any]:
    """The case without its token lists (they are in the JSON file)."""
    out = dict(case)
    for key in ("off", "on"):
        if key in out:
            out[key] = {k: v for k, v in out[key].items() if k != "tokens"}
    return out


if __name__ == "__main__":
    sys.exit(main())
