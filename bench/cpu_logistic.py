"""The CPU's float32 logistic (``providers_cpu/ops/logistic.py``) against NumPy and onnxruntime.

    python bench/cpu_logistic.py [--sizes 4096 65536 ...] [--runs 200] [--threads 1] [--sweep]

On the same float32 arrays (standard normal times 8), interleaved in one process, medians
in ns per value:

- ``kernel``: ``logistic(x)`` (the compiled loop when numba is on, on the caller's thread);
- ``numpy``: 1 / (1 + exp(-x)) in three in-place ufunc passes (the CPU Sigmoid before);
- ``onnxep``: a one-node Sigmoid session (``run`` overhead included);
- ``ort``: onnxruntime's Sigmoid session (MLAS's logistic, ``run`` overhead included);
- ``kernel silu`` / ``ort quickgelu``: x * sigmoid(x), ``logistic(x, mul=True)`` against
  onnxruntime's com.microsoft QuickGelu with alpha 1 (what it fuses Sigmoid + Mul into).

And the largest absolute error of the kernel and of onnxruntime against a float64 sigmoid
on those arrays; ``--sweep`` measures the kernel's over every float32 (a minute or two).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _ort_session(op: str, threads: int, **attrs):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    domain = "com.microsoft" if op == "QuickGelu" else ""
    node = helper.make_node(op, ["x"], ["y"], domain=domain or None, **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])],
    )
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(graph, opset_imports=opsets).SerializeToString()
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return model, ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def _numpy_sigmoid(x: np.ndarray) -> np.ndarray:
    t = np.negative(x, out=np.empty(x.shape, x.dtype))
    with np.errstate(over="ignore"):
        np.exp(t, out=t)
    t += 1
    np.reciprocal(t, out=t)
    return t


def _exact(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


def sweep() -> float:
    """The kernel's largest absolute error over every float32 (NaN left out)."""
    from onnxep.providers_cpu.ops.logistic import logistic

    worst, at = 0.0, 0.0
    step = 1 << 24
    for start in range(0, 1 << 32, step):
        x = np.arange(start, start + step, dtype=np.uint64).astype(np.uint32).view(np.float32)
        x = x[~np.isnan(x)]
        err = np.abs(logistic(x) - _exact(x))
        i = int(err.argmax())
        if err[i] > worst:
            worst, at = float(err[i]), float(x[i])
    print(f"largest error over every float32: {worst:.3g} at x = {at!r}")
    return worst


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="*", default=[4096, 65536, 409600, 1638400])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1, help="both sides' threads (0: defaults)")
    ap.add_argument("--sweep", action="store_true", help="the error over every float32")
    args = ap.parse_args()

    import onnxep
    from onnxep.providers_cpu import jit
    from onnxep.providers_cpu.ops.logistic import logistic
    from onnxep.providers_cpu.threads import blas_threads, cpu_count

    model, ort_sig = _ort_session("Sigmoid", args.threads)
    _, ort_qg = _ort_session("QuickGelu", args.threads, alpha=1.0)
    so = onnxep.SessionOptions(intra_op_num_threads=args.threads)
    ours = onnxep.InferenceSession(model, so, providers=["cpu"])
    limit = args.threads or cpu_count()
    print(f"{jit.jit_status()}; threads {args.threads or 'default'}; medians of {args.runs}")
    print(
        "| values | kernel | numpy | onnxep Sigmoid | ort Sigmoid | kernel silu | ort QuickGelu |"
        " kernel / ort | err kernel | err ort |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    # The run's thread count, as a session's run sets it, for any pool the kernel uses (entered
    # once: each entry may set BLAS's count through threadpoolctl)
    with blas_threads(limit):
        for n in args.sizes:
            _row(n, args.runs, logistic, ours, ort_sig, ort_qg)
    if args.sweep:
        sweep()


def _row(n, runs, logistic, ours, ort_sig, ort_qg) -> None:
    """One size: every side timed interleaved, the medians in ns a value, the errors."""
    x = (np.random.default_rng(0).standard_normal(n) * 8).astype(np.float32)
    feed = {"x": x}
    fns = {
        "kernel": lambda: logistic(x),
        "numpy": lambda: _numpy_sigmoid(x),
        "onnxep": lambda: ours.run(None, feed),
        "ort": lambda: ort_sig.run(None, feed),
        "silu": lambda: logistic(x, mul=True),
        "ortqg": lambda: ort_qg.run(None, feed),
    }
    for f in fns.values():
        f()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(runs):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    ns = {k: statistics.median(v) * 1e9 / n for k, v in times.items()}
    ref = _exact(x)
    e_k = np.abs(logistic(x) - ref).max()
    e_o = np.abs(ort_sig.run(None, feed)[0] - ref).max()
    print(
        f"| {n} | {ns['kernel']:.3f} | {ns['numpy']:.3f} | {ns['onnxep']:.3f} | {ns['ort']:.3f}"
        f" | {ns['silu']:.3f} | {ns['ortqg']:.3f} | {ns['kernel'] / ns['ort']:.2f}"
        f" | {e_k:.2g} | {e_o:.2g} |"
    )


if __name__ == "__main__":
    main()
