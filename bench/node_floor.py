"""Per-node cost of chains of one small op, onnxep against onnxruntime, per op kind.

    python bench/node_floor.py [--nodes 200] [--runs 150] [--only Add Reshape ...]

``bench/overhead.py`` measures the executor's walk on 500 same-shape Adds, where each
step is one NumPy call; this runs the same kind of chain for other ops and operand
shapes (a constant that broadcasts, a Reshape, a Relu...), so what a kernel or the
generated step adds above its NumPy call shows per op. Both sides run unfused:
onnxep with ``fuse_elementwise_chains`` off, onnxruntime with graph optimizations
off, one thread each, alternating run by run; medians per node and their ratio.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _chain(op, n, shape, const=None, attrs=None):
    extra = [] if const is None else ["k"]
    nodes = [
        helper.make_node(
            op,
            ["x" if i == 0 else f"t{i - 1}", *extra],
            [f"t{i}" if i < n - 1 else "y"],
            **(attrs or {}),
        )
        for i in range(n)
    ]
    inits = [] if const is None else [numpy_helper.from_array(const, "k")]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)


def _f32(shape, value=1.0):
    return np.full(shape, value, np.float32)


#: name -> (op, input shape, constant operand or None, attributes)
CASES = {
    "Add [4]+[4]": ("Add", [4], _f32(4), None),
    "Mul [4]*[4]": ("Mul", [4], _f32(4), None),
    "Div [4]/[4]": ("Div", [4], _f32(4), None),
    "Add [16,64]+[64]": ("Add", [16, 64], _f32(64, 0.5), None),
    "Mul [2,4]*[2,1]": ("Mul", [2, 4], _f32((2, 1)), None),
    "Sub [1,8,4,4]-[1,8,1,1]": ("Sub", [1, 8, 4, 4], _f32((1, 8, 1, 1), 0.5), None),
    "Relu [4]": ("Relu", [4], None, None),
    "Reshape [4]": ("Reshape", [4], np.array([4], np.int64), None),
    "Transpose [2,2]": ("Transpose", [2, 2], None, {"perm": [1, 0]}),
    "Sigmoid [4]": ("Sigmoid", [4], None, None),
    "Softmax [1,4]": ("Softmax", [1, 4], None, {"axis": -1}),
}


def measure(n: int = 200, runs: int = 150, only: list[str] | None = None) -> dict[str, dict]:
    import onnxruntime as ort

    import onnxep
    from bench.cpu_profiles import alternating_medians

    so = onnxep.SessionOptions(disabled_rewrites=["fuse_elementwise_chains"])
    so.intra_op_num_threads = 1
    oso = ort.SessionOptions()
    oso.intra_op_num_threads = 1
    oso.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    oso.add_session_config_entry("session.intra_op.allow_spinning", "0")
    rng = np.random.default_rng(0)
    out = {}
    for name, (op, shape, const, attrs) in CASES.items():
        if only and not any(o in name for o in only):
            continue
        model = _chain(op, n, shape, const, attrs)
        ours = onnxep.InferenceSession(model, so, providers=["cpu"])
        theirs = ort.InferenceSession(
            model.SerializeToString(), oso, providers=["CPUExecutionProvider"]
        )
        feed = {"x": rng.random(shape).astype(np.float32)}
        a, b = alternating_medians(ours, theirs, feed, runs)
        ma, mb = a * 1e9 / n, b * 1e9 / n
        out[name] = {"onnxep_ns": ma, "onnxruntime_ns": mb, "ratio": ma / mb}
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--runs", type=int, default=150)
    ap.add_argument("--only", nargs="*", help="cases whose name contains one of these")
    a = ap.parse_args()
    for name, r in measure(a.nodes, a.runs, a.only).items():
        print(
            f"{name:26s} onnxep {r['onnxep_ns']:7.1f} ns/node  "
            f"onnxruntime {r['onnxruntime_ns']:7.1f}  ratio {r['ratio']:.2f}"
        )
