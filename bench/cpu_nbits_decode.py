"""An int4 decoder's decode step on the CPU: onnxep against onnxruntime, interleaved, one process.

    python bench/cpu_nbits_decode.py MODEL.onnx [--steps 30] [--past 16] [--threads 0]
                                     [--rounds 1] [--profile]

MODEL is a genai-format decoder (``bench/make_models.py --kind genai --dtype int4``;
``bench/run_all.py --large`` builds qwen2.5-0.5b's). Each round times ``--steps`` decode
steps of each side, alternated as ``bench/run_all.py`` alternates them (onnxruntime's
step, then onnxep's: onnxruntime's pool threads may still be spinning when onnxep's step
starts), and prints the medians and their ratio. The machine's
memory bandwidth is measured in the same round (a NumPy copy of 256 MB: read plus
write bytes over time, best of 5), with the packed weights' bytes over it: the step's
memory floor. ``--profile`` adds onnxep's per-node profile by op type (MatMulNBits split
into the LM head and the layers' projections) beside onnxruntime's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def feeds_for(path: str, past: int) -> dict:
    import onnx

    m = onnx.load(path, load_external_data=False)
    feeds = {"input_ids": np.array([[42]], np.int64)}
    config = Path(path).with_name("genai_config.json")
    # a symbolic head size: genai_config.json's
    head_size = (
        json.loads(config.read_text())["model"]["decoder"]["head_size"] if config.exists() else 0
    )
    for i in m.graph.input:
        if i.name == "attention_mask":
            feeds[i.name] = np.ones((1, past + 1), np.int64)
        elif i.name.startswith("past_key_values."):
            dims = [d.dim_value for d in i.type.tensor_type.shape.dim]
            heads, hd = dims[1], dims[3] or head_size
            rng = np.random.default_rng(len(feeds))
            feeds[i.name] = rng.standard_normal((1, heads, past, hd)).astype(np.float32)
    return feeds


def weight_bytes(path: str) -> int:
    """The MatMulNBits weights', scales' and zero points' bytes: what a decode step reads."""
    import onnx

    m = onnx.load(path)
    inits = {t.name: t for t in m.graph.initializer}
    total = 0
    for node in m.graph.node:
        if node.op_type == "MatMulNBits":
            for name in node.input[1:4]:
                if name in inits:
                    total += len(onnx.numpy_helper.to_array(inits[name]).tobytes())
    return total


def bandwidth() -> float:
    """Bytes a second a NumPy copy moves (read plus write), best of 5, 256 MB."""
    src = np.ones(1 << 26, np.float32)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * src.nbytes / best


def category(name: str, op: str) -> str:
    if op != "MatMulNBits":
        return op
    for k in ("lm_head", "qkv", "o_proj", "gate", "up", "down"):
        if k in name:
            return f"MatMulNBits {k}"
    return "MatMulNBits"


def by_op(events) -> dict[str, tuple[int, float]]:
    per: dict[str, list[float]] = defaultdict(list)
    kind: dict[str, str] = {}
    for name, op, us in events:
        per[name].append(us)
        kind[name] = category(name, op)
    out: dict[str, tuple[int, float]] = {}
    for name, d in per.items():
        n, t = out.get(kind[name], (0, 0.0))
        out[kind[name]] = (n + 1, t + statistics.median(d))
    return out


def profile(path: str, feeds: dict, threads: int, runs: int) -> None:
    import onnxruntime as ort

    import onnxep

    so = onnxep.SessionOptions(enable_profiling=True, intra_op_num_threads=threads)
    ours = onnxep.InferenceSession(path, so, providers=["cpu"])
    for _ in range(3):
        ours.run(None, feeds)
    skip = len(ours.profiler.events)  # the warm-up's
    for _ in range(runs):
        ours.run(None, feeds)
    mine = by_op(
        (e["name"], e["args"].get("op_type", "?"), float(e["dur"]))
        for e in ours.profiler.events[skip:]
        if e["cat"] == "Node"
    )
    with tempfile.TemporaryDirectory() as tmp:
        oso = ort.SessionOptions()
        oso.log_severity_level = 4
        oso.intra_op_num_threads = threads
        oso.enable_profiling = True
        oso.profile_file_prefix = str(Path(tmp) / "ort")
        th = ort.InferenceSession(path, oso, providers=["CPUExecutionProvider"])
        for _ in range(runs):
            th.run(None, feeds)
        ev = json.loads(Path(th.end_profiling()).read_text())
    theirs = by_op(
        (e["name"], e["args"].get("op_name", "?"), float(e["dur"]))
        for e in ev
        if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")
    )
    print(
        f"kernels (sum of node medians): onnxep {sum(t for _, t in mine.values()) / 1e3:.2f} ms,"
        f" onnxruntime {sum(t for _, t in theirs.values()) / 1e3:.2f} ms"
    )
    print(f"{'op':28s} {'nodes':>5s} {'onnxep ms':>10s} {'nodes':>5s} {'ort ms':>8s}")
    keys = sorted(set(mine) | set(theirs), key=lambda o: -mine.get(o, (0, 0.0))[1])
    for op in keys[:14]:
        n1, t1 = mine.get(op, (0, 0.0))
        n2, t2 = theirs.get(op, (0, 0.0))
        print(f"{op:28s} {n1:5d} {t1 / 1e3:10.2f} {n2:5d} {t2 / 1e3:8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--past", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()

    import onnxruntime as ort

    import onnxep

    feeds = feeds_for(a.model, a.past)
    wb = weight_bytes(a.model)
    ours = onnxep.InferenceSession(
        a.model, onnxep.SessionOptions(intra_op_num_threads=a.threads), providers=["cpu"]
    )
    oso = ort.SessionOptions()
    oso.log_severity_level = 4
    oso.intra_op_num_threads = a.threads
    theirs = ort.InferenceSession(a.model, oso, providers=["CPUExecutionProvider"])
    y0 = ours.run(None, feeds)[0]
    y1 = theirs.run(None, feeds)[0]
    err = float(np.abs(y0 - y1).max() / max(np.abs(y1).max(), 1e-30))
    same = bool((y0.argmax(-1) == y1.argmax(-1)).all())
    print(f"logits: max |diff| / max |ort| {err:.2e}, argmax equal {same}")
    sides = [("onnxep", lambda: ours.run(None, feeds)), ("ort", lambda: theirs.run(None, feeds))]
    for _ in range(3):
        for _, f in sides:
            f()
    for r in range(a.rounds):
        bw = bandwidth()
        times: dict[str, list[float]] = {s: [] for s, _ in sides}
        for _ in range(a.steps):
            for s, f in sides[::-1]:  # onnxruntime first, as bench/run_all.py's steps alternate
                t0 = time.perf_counter()
                f()
                times[s].append(time.perf_counter() - t0)
        mo = statistics.median(times["onnxep"]) * 1e3
        mt = statistics.median(times["ort"]) * 1e3
        floor = wb / bw * 1e3
        print(
            f"round {r}: onnxep {mo:.2f} ms, onnxruntime {mt:.2f} ms, ratio {mo / mt:.2f};"
            f" copy {bw / 1e9:.1f} GB/s, weights {wb / 1e6:.0f} MB -> floor {floor:.2f} ms"
        )
    if a.profile:
        profile(a.model, feeds, a.threads, a.steps)


if __name__ == "__main__":
    main()
