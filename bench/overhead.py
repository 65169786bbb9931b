"""Executor host overhead per node, against onnxruntime's, on a chain of tiny Adds.

    python bench/overhead.py [--nodes 500] [--runs 200] [--providers cuda]

Each node adds a 4-element constant, so the kernels cost next to nothing and
the time per node is what each runtime spends walking its plan (on a GPU:
the host's cost of launching each node, executor included). ``onnxep`` is the
default session, where the CPU provider fuses the chain into one compiled node
(``fuse_elementwise_chains``); ``onnxep-unfused`` has that rewrite off, so it
walks 500 steps: the executor's own cost per node, the figure issue 23's bar is on.
``numpy-calls`` is the floor under it: the same 500 ``np.add`` calls, each into the
last one's buffer as the plan's steps do, as one plain Python function.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def chain_model(n: int) -> onnx.ModelProto:
    nodes = [
        helper.make_node(
            "Add", ["x" if i == 0 else f"t{i - 1}", "one"], [f"t{i}" if i < n - 1 else "y"]
        )
        for i in range(n)
    ]
    one = numpy_helper.from_array(np.ones(4, np.float32), "one")
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        [one],
    )
    # IR 10: onnxruntime builds before 1.31 refuse newer IR versions
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _numpy_calls(n: int):
    """``x + 1`` n times as n ``np.add`` calls in straight-line code, without a runtime."""
    body = ["def run(x):", "    a = add(x, one)"]
    body += ["    a = add(a, one, a)"] * (n - 1)
    env = {"add": np.add, "one": np.ones(4, np.float32)}
    exec("\n".join(body) + "\n    return a\n", env)
    return env["run"]


def measure(n: int = 500, runs: int = 200, providers: list[str] | None = None) -> dict[str, float]:
    import onnxruntime as ort

    import onnxep

    model = chain_model(n)
    x = np.zeros(4, np.float32)
    ours = onnxep.InferenceSession(model, providers=providers or ["cpu"])
    unfused = onnxep.InferenceSession(
        model,
        onnxep.SessionOptions(disabled_rewrites=["fuse_elementwise_chains"]),
        providers=providers or ["cpu"],
    )
    so = ort.SessionOptions()
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    theirs = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    floor = _numpy_calls(n)
    sides = {
        "onnxep": lambda: ours.run(None, {"x": x}),
        "onnxep-unfused": lambda: unfused.run(None, {"x": x}),
        "onnxruntime": lambda: theirs.run(None, {"x": x}),
        "numpy-calls": lambda: floor(x),
    }
    samples: dict[str, list[float]] = {k: [] for k in sides}
    for run in sides.values():
        for _ in range(10):
            run()
    for _ in range(runs):
        for name, run in sides.items():
            t0 = time.perf_counter()
            run()
            samples[name].append(time.perf_counter() - t0)
    return {name: float(np.median(v)) / n * 1e6 for name, v in samples.items()}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--providers", default="cpu", help="comma-separated, for onnxep")
    a = ap.parse_args()
    per = measure(a.nodes, a.runs, a.providers.split(","))
    for name, us in per.items():
        print(f"{name:15s} {us:.3f} us per node")
    for name in ("onnxep", "onnxep-unfused"):
        print(f"{name} / onnxruntime: {per[name] / per['onnxruntime']:.2f}x")
    # what the walk adds to the NumPy calls it makes
    print(f"onnxep-unfused - numpy-calls: {per['onnxep-unfused'] - per['numpy-calls']:+.3f} us")
