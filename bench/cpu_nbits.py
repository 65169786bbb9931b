"""MatMulNBits alone on the CPU: onnxep against onnxruntime, one-node sessions, interleaved.

    python bench/cpu_nbits.py [--rows 1] [--threads 0] [--runs 200] [--bits 4]
                              [--levels 0 4] [--zp both|no|yes] [--shapes 896x896 ...]

Random 4- or 8-bit weights (block 32) for the given K x N shapes (default: qwen2.5-0.5b's
896x1152, 896x896, 896x4864, 4864x896 and the 896x151936 LM head), with and without
zero points, at accuracy levels 0 and 4; each line is the medians of ``--runs`` runs of
both sessions, alternated, and their ratio (onnxep / onnxruntime), plus the largest
difference between the two outputs relative to the output's largest magnitude.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = ["896x1152", "896x896", "896x4864", "4864x896", "896x151936"]


def model(k: int, n: int, bits: int, block: int, level: int, zp: bool, seed: int = 0) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    kb = -(-k // block)
    blob = block * bits // 8
    b = rng.integers(0, 256, size=(n, kb, blob), dtype=np.uint8)
    s = (rng.random((n * kb,), dtype=np.float32) * 0.02 + 0.001).astype(np.float32)
    inits = [numpy_helper.from_array(b, "b"), numpy_helper.from_array(s, "s")]
    inputs = ["a", "b", "s"]
    if zp:
        zb = -(-kb * bits // 8)
        z = rng.integers(0, 256, size=(n * zb,), dtype=np.uint8)
        inits.append(numpy_helper.from_array(z, "z"))
        inputs.append("z")
    node = helper.make_node(
        "MatMulNBits",
        inputs,
        ["y"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=bits,
        block_size=block,
        accuracy_level=level,
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [None, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, n])],
        initializer=inits,
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def row(k, n, bits, level, zp, rows, threads, runs) -> float:
    import onnxruntime as ort

    import onnxep

    m = model(k, n, bits, 32, level, zp)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    theirs = ort.InferenceSession(m, so, providers=["CPUExecutionProvider"])
    ours = onnxep.InferenceSession(
        m, onnxep.SessionOptions(intra_op_num_threads=threads), providers=["cpu"]
    )
    a = np.random.default_rng(1).standard_normal((rows, k)).astype(np.float32)
    feed = {"a": a}
    y0 = ours.run(None, feed)[0]
    y1 = theirs.run(None, feed)[0]
    err = float(np.abs(y0 - y1).max() / max(np.abs(y1).max(), 1e-30))
    t: dict[str, list[float]] = {"ours": [], "ort": []}
    for _ in range(3):
        ours.run(None, feed)
        theirs.run(None, feed)
    for _ in range(runs):
        for key, s in (("ours", ours), ("ort", theirs)):
            t0 = time.perf_counter()
            s.run(None, feed)
            t[key].append(time.perf_counter() - t0)
    us = {key: statistics.median(v) * 1e6 for key, v in t.items()}
    ratio = us["ours"] / us["ort"]
    print(
        f"| {k}x{n} | {bits} | {level} | {'yes' if zp else 'no'} | {rows} | {us['ours']:.0f}"
        f" | {us['ort']:.0f} | {ratio:.2f} | {err:.1e} |",
        flush=True,
    )
    return ratio


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="*", default=SHAPES)
    ap.add_argument("--rows", type=int, nargs="*", default=[1])
    ap.add_argument("--threads", type=int, default=0, help="both sides' threads (0: defaults)")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--bits", type=int, nargs="*", default=[4])
    ap.add_argument("--levels", type=int, nargs="*", default=[0, 4])
    ap.add_argument("--zp", choices=["both", "no", "yes"], default="both")
    a = ap.parse_args()
    from onnxep.providers_cpu import jit

    print(f"{jit.jit_status()}; threads {a.threads or 'default'}; medians of {a.runs}")
    print("| K x N | bits | level | zp | rows | onnxep us | ort us | ratio | rel diff |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    zps = {"both": [False, True], "no": [False], "yes": [True]}[a.zp]
    for shape in a.shapes:
        k, n = (int(v) for v in shape.split("x"))
        runs = a.runs if k * n < 50_000_000 else max(10, a.runs // 10)
        for bits in a.bits:
            for level in a.levels:
                for zp in zps:
                    for rows in a.rows:
                        row(k, n, bits, level, zp, rows, a.threads, runs)


if __name__ == "__main__":
    main()
