"""onnxep against onnxruntime-gpu on one decoder export, in one process (the GPU machine).

    python3 bench/gpu_vs_ort.py MODEL_DIR --json OUT.json [--contexts 16,2000,8000,32000]
        [--prefill 128,512,2000,8000] [--steps 32] [--tokens 2000,8000] [--budget S]
    python3 bench/gpu_vs_ort.py MODEL_DIR --memory onnxep|onnxruntime   (one side, own process)

MODEL_DIR is a genai-format folder (onnxruntime-genai's model builder, or the project's
factory): model.onnx, genai_config.json. Both sides run the same loop on the same feeds:

* **decode at context C**: the KV caches are fixed-capacity device buffers (capacity C +
  steps, random values) bound as both past and present, the mask has the buffers' full
  capacity with C + 1 ones, one token id is read back per step (argmax on the device, with
  CuPy on both sides), ids and mask are updated on the device. onnxep: IO binding with its
  capture policy ``auto`` (one graph replayed per step after warm-up); onnxruntime: IO
  binding with ``enable_cuda_graph`` on (and a run with it off). Median ms per step, and
  onnxep's captures, replays and fallbacks.
* **prefill of P tokens**: one run of the prompt (past length 0), logits and presents
  left on the device, warm (median of repeats after a first run); onnxruntime's side has
  its CUDA graph off (a captured graph replays its own shapes, whatever is bound).
* **greedy tokens**: ``onnxep.generate`` against an onnxruntime loop (past fed back)
  for ``--steps`` tokens after a ``--tokens`` P-token prompt; equal or the first step
  where they part.
* ``--memory SIDE``: device memory in use (cudaMemGetInfo) after a 2000-token prompt and
  32 steps, on one side, in this process alone (the driver counts every context).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def _cupy():
    import cupy

    return cupy


def genai_spec(model_dir: Path) -> dict:
    cfg = json.loads((model_dir / "genai_config.json").read_text())
    dec = cfg["model"]["decoder"]
    return {
        "file": str(model_dir / dec.get("filename", "model.onnx")),
        "layers": int(dec["num_hidden_layers"]),
        "kv_heads": int(dec["num_key_value_heads"]),
        "head_size": int(dec["head_size"]),
        "vocab": int(cfg["model"]["vocab_size"]),
        "context": int(cfg["model"].get("context_length", 4096)),
        "past_key": dec["inputs"].get("past_key_names", "past_key_values.%d.key"),
        "past_value": dec["inputs"].get("past_value_names", "past_key_values.%d.value"),
        "present_key": dec["outputs"].get("present_key_names", "present.%d.key"),
        "present_value": dec["outputs"].get("present_value_names", "present.%d.value"),
    }


def ort_session(file: str, provider: Any) -> Any:
    """An onnxruntime session of ``file`` on ``provider`` (a name, or (name, options)), its
    warnings off."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(file, so, providers=[provider])


def kv_dtype_of(sess_inputs: list, name: str) -> np.dtype:
    t = next(i.type for i in sess_inputs if i.name == name)
    return np.dtype(np.float16) if "float16" in t else np.dtype(np.float32)


class _Side:
    """One runtime's IO-bound decode over fixed-capacity caches (see the module's note)."""

    name = ""

    def __init__(self, spec: dict, capacity: int) -> None:
        self.spec, self.capacity = spec, capacity
        self.cp = _cupy()

    def _state_names(self) -> list[tuple[str, str]]:
        s = self.spec
        out = []
        for i in range(s["layers"]):
            out.append((s["past_key"] % i, s["present_key"] % i))
            out.append((s["past_value"] % i, s["present_value"] % i))
        return out


class OnnxepSide(_Side):
    name = "onnxep"

    def __init__(self, spec: dict, capacity: int, capture: str = "auto") -> None:
        super().__init__(spec, capacity)
        import onnxep

        self.sess = onnxep.InferenceSession(
            spec["file"], providers=[("cuda", {"capture": capture}), "cpu"]
        )
        self.kv_dtype = kv_dtype_of(self.sess.get_inputs(), spec["past_key"] % 0)

    def bind(self, ctx: int, rng: np.random.Generator) -> None:
        cp, s = self.cp, self.spec
        io = self.io = self.sess.io_binding()
        shape = (1, s["kv_heads"], self.capacity, s["head_size"])
        with self.sess.providers[0].run_context():
            self.ids = cp.zeros((1, 1), cp.int64)
            self.mask = cp.zeros((1, self.capacity), cp.int64)
            self.mask[0, : ctx + 1] = 1
        self.pos = ctx
        io.bind_output("logits", "cuda")  # first: get_outputs() lists bound outputs in order
        io.bind_input("input_ids", self.ids)
        io.bind_input("attention_mask", self.mask)
        self.kv = []
        for past, present in self._state_names():
            buf = cp.asarray(rng.standard_normal(shape, np.float32) * 0.5, dtype=self.kv_dtype)
            io.bind_input(past, buf)
            io.bind_output(present, buf)
            self.kv.append(buf)
        cp.cuda.Device().synchronize()

    def step(self) -> int:
        cp = self.cp
        self.sess.run_with_iobinding(self.io)
        logits = self.io.get_outputs()[0].value
        with self.sess.providers[
            0
        ].run_context():  # the provider's stream: ordered after the run, before the next
            tok = cp.argmax(logits.reshape(-1))
            self.ids[0, 0] = tok
            self.pos += 1
            if self.pos < self.capacity:
                self.mask[0, self.pos] = 1
            return int(tok.get())

    def stats(self) -> dict:
        return self.sess.capture_stats()


class OrtSide(_Side):
    name = "onnxruntime"

    def __init__(self, spec: dict, capacity: int, graph: bool = True) -> None:
        super().__init__(spec, capacity)
        import onnxruntime as ort

        self.ort = ort
        self.provider = ("CUDAExecutionProvider", {"enable_cuda_graph": "1" if graph else "0"})
        self.sess = ort_session(spec["file"], self.provider)
        self.kv_dtype = kv_dtype_of(self.sess.get_inputs(), spec["past_key"] % 0)
        self.graph = graph
        self._bound = False

    def _view(self, value: Any, shape: tuple, dtype: Any) -> Any:
        cp = self.cp
        dtype = np.dtype(dtype)
        n = int(np.prod(shape)) * dtype.itemsize
        mem = cp.cuda.UnownedMemory(value.data_ptr(), n, value)
        return cp.ndarray(shape, dtype, cp.cuda.MemoryPointer(mem, 0))

    def bind(self, ctx: int, rng: np.random.Generator) -> None:
        ort, s = self.ort, self.spec
        if self.graph and self._bound:
            # onnxruntime's graph replays the addresses it captured on its first run, whatever
            # is bound after: a second context's buffers need a session of their own (reusing
            # one timed the first context's step at every later one: 1.5B flat from 16 to
            # 32000 tokens, under the KV reads' own bandwidth floor)
            self.io = None
            self.sess = ort_session(s["file"], self.provider)
        self._bound = True
        io = self.io = self.sess.io_binding()
        shape = (1, s["kv_heads"], self.capacity, s["head_size"])
        mask = np.zeros((1, self.capacity), np.int64)
        mask[0, : ctx + 1] = 1
        self._ids = ort.OrtValue.ortvalue_from_numpy(np.zeros((1, 1), np.int64), "cuda", 0)
        self._mask = ort.OrtValue.ortvalue_from_numpy(mask, "cuda", 0)
        self.ids = self._view(self._ids, (1, 1), np.int64)
        self.mask = self._view(self._mask, (1, self.capacity), np.int64)
        self.pos = ctx
        io.bind_ortvalue_input("input_ids", self._ids)
        io.bind_ortvalue_input("attention_mask", self._mask)
        self.kv = []
        for past, present in self._state_names():
            host = (rng.standard_normal(shape, np.float32) * 0.5).astype(self.kv_dtype)
            buf = ort.OrtValue.ortvalue_from_numpy(host, "cuda", 0)
            io.bind_ortvalue_input(past, buf)
            io.bind_ortvalue_output(present, buf)
            self.kv.append(buf)
        logits_dtype = next(o.type for o in self.sess.get_outputs() if o.name == "logits")
        ldt = np.float16 if "float16" in logits_dtype else np.float32
        self._logits = ort.OrtValue.ortvalue_from_shape_and_type((1, 1, s["vocab"]), ldt, "cuda", 0)
        self.logits = self._view(self._logits, (s["vocab"],), ldt)
        io.bind_ortvalue_output("logits", self._logits)
        self.cp.cuda.Device().synchronize()

    def step(self) -> int:
        cp = self.cp
        self.sess.run_with_iobinding(self.io)  # synchronizes its stream before returning
        tok = cp.argmax(self.logits)
        self.ids[0, 0] = tok
        self.pos += 1
        if self.pos < self.capacity:
            self.mask[0, self.pos] = 1
        t = int(tok.get())  # also orders the updates before the next run
        return t

    def stats(self) -> dict:
        return {"cuda_graph": self.graph}


def time_decode(side: _Side, ctx: int, steps: int, warmup: int = 3) -> dict:
    side.bind(ctx, np.random.default_rng(ctx))
    for _ in range(warmup):
        side.step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        side.step()
        times.append((time.perf_counter() - t0) * 1e3)
    ms = float(np.median(times))
    return {"ms": ms, "tok_s": 1000.0 / ms, "p90_ms": float(np.percentile(times, 90))}


# -- prefill --------------------------------------------------------------------------------


def prefill_feeds(spec: dict, kv_dtype: np.dtype, p: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {
        "input_ids": rng.integers(0, spec["vocab"], (1, p)).astype(np.int64),
        "attention_mask": np.ones((1, p), np.int64),
    }
    empty = np.zeros((1, spec["kv_heads"], 0, spec["head_size"]), kv_dtype)
    for i in range(spec["layers"]):
        feeds[spec["past_key"] % i] = empty
        feeds[spec["past_value"] % i] = empty
    return feeds


def time_prefill_onnxep(side: OnnxepSide, p: int, repeats: int) -> dict:
    cp = side.cp
    feeds = prefill_feeds(side.spec, side.kv_dtype, p)
    io = side.sess.io_binding()
    for k, v in feeds.items():
        io.bind_input(k, cp.asarray(v))
    for o in side.sess.get_outputs():
        io.bind_output(o.name, "cuda")
    times = []
    for r in range(repeats + 1):
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        side.sess.run_with_iobinding(io)
        side.sess.providers[0].synchronize()
        if r:
            times.append((time.perf_counter() - t0) * 1e3)
    return {"ms": float(np.median(times))}


def time_prefill_ort(side: OrtSide, p: int, repeats: int) -> dict:
    ort = side.ort
    feeds = prefill_feeds(side.spec, side.kv_dtype, p)
    io = side.sess.io_binding()
    vals = {k: ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0) for k, v in feeds.items()}
    for k, v in vals.items():
        io.bind_ortvalue_input(k, v)
    for o in side.sess.get_outputs():
        io.bind_output(o.name, "cuda")
    times = []
    for r in range(repeats + 1):
        t0 = time.perf_counter()
        side.sess.run_with_iobinding(io)
        io.synchronize_outputs()
        if r:
            times.append((time.perf_counter() - t0) * 1e3)
    return {"ms": float(np.median(times))}


# -- greedy tokens --------------------------------------------------------------------------


def ort_greedy(
    spec: dict, prompt: np.ndarray, steps: int, probe: Callable[[], None] | None = None
) -> list[int]:
    """onnxruntime-gpu, past fed back (no sharing: the plainest loop), host feeds; ``probe``
    is called after the last step, while the session and its cache still hold memory."""

    sess = ort_session(spec["file"], "CUDAExecutionProvider")
    kv_dtype = kv_dtype_of(sess.get_inputs(), spec["past_key"] % 0)
    feeds = prefill_feeds(spec, kv_dtype, prompt.shape[1])
    feeds["input_ids"] = prompt
    names = [o.name for o in sess.get_outputs()]
    out: list[int] = []
    total = prompt.shape[1]
    for _ in range(steps):
        res = dict(zip(names, sess.run(None, feeds)))
        tok = int(np.argmax(res["logits"][0, -1]))
        out.append(tok)
        total += 1
        feeds["input_ids"] = np.array([[tok]], np.int64)
        feeds["attention_mask"] = np.ones((1, total), np.int64)
        for i in range(spec["layers"]):
            feeds[spec["past_key"] % i] = res[spec["present_key"] % i]
            feeds[spec["past_value"] % i] = res[spec["present_value"] % i]
    if probe is not None:
        probe()
    return out


def onnxep_greedy(
    spec: dict, prompt: np.ndarray, steps: int, probe: Callable[[], None] | None = None
) -> tuple[list[int], dict]:
    import onnxep

    sess = onnxep.InferenceSession(spec["file"], providers=["cuda", "cpu"])
    res = onnxep.generate(sess, prompt, max_new_tokens=steps)
    if probe is not None:
        probe()
    return res.tokens, sess.capture_stats()


def memory_in_use(side: str, spec: dict) -> dict:
    cp = _cupy()
    free0, total = cp.cuda.runtime.memGetInfo()
    prompt = np.random.default_rng(1).integers(0, spec["vocab"], (1, 2000)).astype(np.int64)
    seen: list[int] = []

    def probe() -> None:  # while the side's session lives (it frees its memory after)
        cp.cuda.Device().synchronize()
        seen.append(cp.cuda.runtime.memGetInfo()[0])

    if side == "onnxep":
        onnxep_greedy(spec, prompt, 32, probe)
    else:
        ort_greedy(spec, prompt, 32, probe)
    free1 = seen[0]
    return {"side": side, "in_use_mb": (total - free1) / 2**20, "grew_mb": (free0 - free1) / 2**20}


def copy_bandwidth() -> float:
    """Device-to-device copy, TB/s counting bytes read and written (the decode floor)."""
    cp = _cupy()
    a = cp.empty(256 * 2**20, cp.uint8)
    b = cp.empty_like(a)
    for _ in range(3):
        b[...] = a
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(20):
        b[...] = a
    end.record()
    end.synchronize()
    ms = cp.cuda.get_elapsed_time(start, end) / 20
    return 2 * a.nbytes / (ms * 1e-3) / 1e12


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--contexts", default="16,2000,8000,32000")
    ap.add_argument("--prefill", default="128,512,2000,8000")
    ap.add_argument("--tokens", default="2000,8000", help="prompt lengths of the token check")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--budget", type=float, default=480.0, help="seconds; later parts skipped")
    ap.add_argument("--memory", choices=("onnxep", "onnxruntime"))
    ap.add_argument("--sides", default="onnxep,onnxruntime,onnxruntime-nograph")
    args = ap.parse_args(argv)
    spec = genai_spec(args.model_dir)
    if args.memory:
        print(json.dumps(memory_in_use(args.memory, spec)))
        return 0
    deadline = time.time() + args.budget
    report: dict[str, Any] = {
        "model": str(args.model_dir),
        "spec": spec,
        "decode": [],
        "prefill": [],
        "tokens": [],
        "skipped": [],
    }

    def save() -> None:
        if args.json:
            args.json.write_text(json.dumps(report, indent=1))

    report["copy_tbs"] = copy_bandwidth()
    contexts = [int(c) for c in args.contexts.split(",") if c]
    cap = max(contexts, default=0) + args.steps + 8  # --contexts '': prefill rows only
    sides = args.sides.split(",")
    made: dict[str, _Side] = {}
    for name in sides:
        try:
            if name == "onnxep":
                made[name] = OnnxepSide(spec, cap)
            elif name == "onnxruntime":
                made[name] = OrtSide(spec, cap, graph=True)
            elif name == "onnxruntime-nograph":
                made[name] = OrtSide(spec, cap, graph=False)
        except Exception as exc:  # a missing peer is reported, not fatal
            report["skipped"].append(f"{name}: {type(exc).__name__}: {exc}"[:400])
    for ctx in contexts:
        for name, side in made.items():
            if time.time() > deadline:
                report["skipped"].append(f"decode {name} ctx {ctx}: budget")
                continue
            try:
                row = {"side": name, "context": ctx, **time_decode(side, ctx, args.steps)}
                row["stats"] = side.stats()
            except Exception as exc:
                row = {"side": name, "context": ctx, "error": f"{type(exc).__name__}: {exc}"[:400]}
            report["decode"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "stats"}), flush=True)
            save()
    for side in made.values():
        for buf in getattr(side, "kv", []):
            del buf
        side.kv = []
    _cupy().get_default_memory_pool().free_all_blocks()
    # onnxruntime's prefill runs on its graph-off session: with enable_cuda_graph on, every
    # run after the first replays the graph it captured (the decode step's shapes), whatever
    # the bound inputs' shapes, so a prompt of any length would time one decode step (an
    # earlier run reported a flat 1.4 ms for 128 to 8000 tokens that way)
    if "onnxruntime-nograph" not in made and "onnxruntime" in made:
        try:
            made["onnxruntime-nograph"] = OrtSide(spec, cap, graph=False)
        except Exception as exc:
            report["skipped"].append(
                f"prefill onnxruntime-nograph: {type(exc).__name__}: {exc}"[:400]
            )
    for p in [int(x) for x in args.prefill.split(",") if x]:
        for name in ("onnxep", "onnxruntime-nograph"):
            side = made.get(name)
            if side is None or time.time() > deadline:
                report["skipped"].append(f"prefill {name} {p}: budget or no side")
                continue
            try:
                fn = time_prefill_onnxep if name == "onnxep" else time_prefill_ort
                row = {"side": name, "tokens": p, **fn(side, p, 5 if p <= 2000 else 3)}
            except Exception as exc:
                row = {"side": name, "tokens": p, "error": f"{type(exc).__name__}: {exc}"[:400]}
            report["prefill"].append(row)
            print(json.dumps(row), flush=True)
            save()
    made.clear()
    for p in [int(x) for x in args.tokens.split(",") if x]:
        if time.time() > deadline:
            report["skipped"].append(f"tokens {p}: budget")
            continue
        prompt = np.random.default_rng(p).integers(0, spec["vocab"], (1, p)).astype(np.int64)
        try:
            ours, stats = onnxep_greedy(spec, prompt, args.steps)
            theirs = ort_greedy(spec, prompt, args.steps)
            part = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
            row = {
                "prompt": p,
                "equal": ours == theirs,
                "first_difference": part,
                "onnxep": ours,
                "onnxruntime": theirs,
                "capture": stats,
            }
        except Exception as exc:
            row = {"prompt": p, "error": f"{type(exc).__name__}: {exc}"[:400]}
        report["tokens"].append(row)
        print(
            json.dumps({k: row.get(k) for k in ("prompt", "equal", "first_difference", "error")}),
            flush=True,
        )
        save()
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
