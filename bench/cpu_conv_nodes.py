"""One Conv node at a time: onnxep's CPU provider against onnxruntime's, same process.

    python bench/cpu_conv_nodes.py [--threads 1] [--runs 50] [--shapes C,COUT,K,HW,STRIDE,G ...]
    python bench/cpu_conv_nodes.py --conv1d [C,COUT,K,L,STRIDE,PAD[,relu] ...]

Each shape is a one-node model (random float32 weights and bias, pads k//2) run by both
sides on the same input, alternately after warm-up; the table gives each side's median
and onnxep / onnxruntime; 2-D shapes add a column for onnxep with its compiled Conv GEMM
off (``blas``: ``providers_cpu/ops/conv_gemm.py``, ``ONNXEP_CPU_CONV_GEMM``), so the
table compares it with the OpenBLAS path in the same process. The default shapes are the
dense, pointwise and depthwise
convolutions of the corpus's CNNs (YOLOv8n, the OCR detectors, MobileNetV3-style
classifiers). Printed with the BLAS kernels numpy runs (OPENBLAS_CORETYPE matters here).

``--conv1d`` runs 1-D convolutions instead (no bias when ``relu`` is absent and K > 64,
as the VAD models' STFT conv; a Relu after the Conv when ``relu`` is given, which both
sides fuse); the defaults are the silero/akiki VAD encoders' convs on short signals, where
the per-call cost around a tiny GEMM is what is measured, so times are in microseconds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

DEFAULT_SHAPES = [
    (64, 64, 3, 40, 1, 1),
    (64, 64, 3, 80, 1, 1),
    (128, 128, 3, 20, 1, 1),
    (32, 64, 1, 80, 1, 1),
    (96, 24, 1, 40, 1, 1),
    (3, 16, 3, 320, 2, 1),
    (64, 64, 3, 56, 2, 64),
    (512, 512, 5, 7, 1, 512),
    (16, 16, 3, 112, 1, 16),
]

# The VAD models' Conv1d nodes: STFT basis (no bias), four encoder convs + Relu, the 1x1 head.
DEFAULT_1D = [
    (1, 258, 256, 576, 128, 0, ""),
    (129, 128, 3, 4, 1, 1, "relu"),
    (128, 64, 3, 4, 2, 1, "relu"),
    (64, 64, 3, 2, 2, 1, "relu"),
    (64, 128, 3, 1, 1, 1, "relu"),
    (128, 1, 1, 1, 1, 0, ""),
]


def conv1d_model(cin: int, cout: int, k: int, length: int, stride: int, pad: int, act: str):
    import onnx
    from onnx import helper as h
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((cout, cin, k)) * 0.1).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W")]
    ins = ["x", "W"]
    if act or k <= 64:
        inits.append(numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "B"))
        ins.append("B")
    conv_out = "c" if act else "y"
    nodes = [
        h.make_node("Conv", ins, [conv_out], kernel_shape=[k], strides=[stride], pads=[pad, pad])
    ]
    if act:
        nodes.append(h.make_node("Relu", ["c"], ["y"]))
    g = h.make_graph(
        nodes,
        "conv1d",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, cin, length])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        inits,
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()


def conv_model(cin: int, cout: int, k: int, hw: int, stride: int, group: int) -> bytes:
    import onnx
    from onnx import helper as h
    from onnx import numpy_helper

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((cout, cin // group, k, k)) * 0.1).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    node = h.make_node(
        "Conv", ["x", "W", "B"], ["y"], kernel_shape=[k, k], strides=[stride] * 2,
        pads=[k // 2] * 4, group=group,
    )  # fmt: skip
    g = h.make_graph(
        [node],
        "conv",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, cin, hw, hw])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")],
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()


def main(argv: list[str] | None = None) -> None:
    import onnxruntime as ort
    from threadpoolctl import threadpool_info

    import onnxep
    from onnxep.providers_cpu.ops import conv_gemm

    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--shapes", nargs="*", default=None, help="CIN,COUT,K,HW,STRIDE,GROUP")
    ap.add_argument("--conv1d", nargs="*", default=None, help="1-D: CIN,COUT,K,L,STRIDE,PAD[,relu]")
    a = ap.parse_args(argv)
    if a.conv1d is not None:
        shapes = [_spec1d(s) for s in a.conv1d] if a.conv1d else DEFAULT_1D
    else:
        shapes = (
            [tuple(int(v) for v in s.split(",")) for s in a.shapes] if a.shapes else DEFAULT_SHAPES
        )
    one_d = a.conv1d is not None
    unit, scale = ("us", 1e6) if one_d else ("ms", 1e3)
    blas = ", ".join(f"{i['internal_api']} {i.get('architecture', '')}" for i in threadpool_info())
    print(f"threads {a.threads}; numpy BLAS: {blas}")
    head = "cin cout k len stride pad act" if one_d else "cin cout k hw stride group"
    print(f"threads {a.threads}; {conv_gemm.status()}")
    print(
        f"{head:28s} {'onnxep ' + unit:>10s} {'ort ' + unit:>8s} {'ratio':>6s}"
        + ("" if one_d else f" {'blas ' + unit:>9s} {'ratio':>6s}")
    )
    for shape in shapes:
        if one_d:
            model = conv1d_model(*shape)
            x = np.random.default_rng(1).standard_normal((1, shape[0], shape[3]))
        else:
            model = conv_model(*shape)
            x = np.random.default_rng(1).standard_normal((1, shape[0], shape[3], shape[3]))
        feed = {"x": x.astype(np.float32)}
        so = ort.SessionOptions()
        so.intra_op_num_threads = a.threads
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        theirs = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
        ours = onnxep.InferenceSession(
            model, onnxep.SessionOptions(intra_op_num_threads=a.threads), providers=["cpu"]
        )
        sides = [("onnxep", ours), ("ort", theirs)]
        if not one_d:
            mode, conv_gemm.MODE = conv_gemm.MODE, "0"
            try:
                blas_side = onnxep.InferenceSession(
                    model, onnxep.SessionOptions(intra_op_num_threads=a.threads), providers=["cpu"]
                )
            finally:
                conv_gemm.MODE = mode
            sides.append(("blas", blas_side))
        want = theirs.run(None, feed)[0]
        for _, s in sides:
            np.testing.assert_allclose(s.run(None, feed)[0], want, rtol=1e-3, atol=1e-3)
        t = {side: [] for side, _ in sides}
        for i in range(a.runs + 5):
            for side, s in sides:
                t0 = time.perf_counter()
                s.run(None, feed)
                if i >= 5:
                    t[side].append(time.perf_counter() - t0)
        m = {k: statistics.median(v) * scale for k, v in t.items()}
        name = " ".join(str(v) for v in shape).strip()
        line = f"{name:28s} {m['onnxep']:10.3f} {m['ort']:8.3f} {m['onnxep'] / m['ort']:6.2f}"
        if "blas" in m:
            line += f" {m['blas']:9.3f} {m['blas'] / m['ort']:6.2f}"
        print(line)


def _spec1d(spec: str) -> tuple:
    parts = spec.split(",")
    return (*(int(v) for v in parts[:6]), parts[6] if len(parts) > 6 else "")


if __name__ == "__main__":
    main()
