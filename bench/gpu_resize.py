"""Resize on the GPU: the CUDA kernel (providers_cuda/ops/op_resize.py) against the generic
kernel it replaced and, where onnxruntime-gpu is installed, onnxruntime's CUDA Resize; prints
one JSON line per case.

    python bench/gpu_resize.py [--calls 200] [--rounds 7]

Each round times ``--calls`` eager calls of each side back to back (CUDA events around
them), the sides interleaved round by round; ``us`` is the median per-call time over the
rounds. ``new`` and ``generic`` are the kernels' built callables on the same CuPy input
(``generic`` uploads its tables each call and interpolates with a dense matmul);
``ort`` is a one-node model through IO binding on device buffers. ``max_diff`` is the
largest difference of ``new`` from ``generic``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "cuda"))

#: (name, input shape, dtype, attributes, scales or sizes)
X2 = {"scales": [1, 1, 2, 2]}
UP4 = {"sizes": [1, 64, 512, 512]}
CASES = [
    ("nearest-x2-yolo-p5", (1, 256, 15, 15), "float16", {"mode": "nearest"}, X2),
    ("nearest-x2-yolo-p4", (1, 128, 30, 30), "float32", {"mode": "nearest"}, X2),
    ("nearest-x2-batch8", (8, 128, 40, 40), "float16", {"mode": "nearest"}, X2),
    ("bilinear-seg-up", (1, 64, 128, 128), "float32", {"mode": "linear"}, UP4),
    ("bilinear-f16-up", (1, 64, 128, 128), "float16", {"mode": "linear"}, UP4),
    ("bicubic-up", (1, 3, 224, 224), "float32", {"mode": "cubic"}, X2),
    ("antialias-down", (1, 3, 1024, 1024), "float32", {"mode": "linear", "antialias": 1},
     {"sizes": [1, 3, 224, 224]}),
]  # fmt: skip


def _node(attrs, dtype):
    from onnxep.providers.node import NodeInfo, ValueInfo

    ins = (ValueInfo("x", "tensor", np.dtype(dtype), None),) + tuple(
        ValueInfo(f"i{k}", "tensor", None, None) for k in (1, 2, 3)
    )
    out = (ValueInfo("y", "tensor", np.dtype(dtype), None),)
    return NodeInfo(op_type="Resize", name="resize", attrs=attrs, inputs=ins, outputs=out, opset=19)


def _host_inputs(inputs):
    scales = inputs.get("scales")
    sizes = inputs.get("sizes")
    return (
        None,
        None if scales is None else np.array(scales, np.float32),
        None if sizes is None else np.array(sizes, np.int64),
    )


def _ort_side(shape, dtype, attrs, inputs, x):
    try:
        import onnxruntime as ort
    except ImportError:
        return None, "onnxruntime is not installed"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return None, "onnxruntime has no CUDAExecutionProvider (onnxruntime-gpu not installed)"
    import resize_cases

    model = resize_cases.resize_model(shape, dtype, attrs, **inputs)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
    binding = sess.io_binding()
    binding.bind_input("x", "cuda", 0, np.dtype(dtype), list(shape), x.data.ptr)
    binding.bind_output("y", "cuda", 0)

    def run():
        sess.run_with_iobinding(binding)

    return run, ""


def _time(cp, fn, calls):
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record()
    for _ in range(calls):
        fn()
    stop.record()
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) * 1000 / calls


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)

    import cupy as cp

    from onnxep.providers.ops import op_resize as generic
    from onnxep.providers_cuda.ops import op_resize
    from onnxep.providers_cuda.xp import cuda_namespace

    xp = cuda_namespace()
    for name, shape, dtype, attrs, inputs in CASES:
        node = _node(attrs, dtype)
        x = cp.asarray(np.random.default_rng(0).standard_normal(shape).astype(dtype))
        host = _host_inputs(inputs)
        new = op_resize.resize(node, xp)
        old = generic.resize(node, xp)
        (a,), (b,) = new(x, *host), old(x, *host)
        diff = float(cp.abs(a.astype(cp.float64) - b.astype(cp.float64)).max())
        sides = {"new": (lambda f=new, x=x, h=host: f(x, *h)),
                 "generic": (lambda f=old, x=x, h=host: f(x, *h))}  # fmt: skip
        ort_run, why = _ort_side(shape, dtype, attrs, inputs, x)
        if ort_run is not None:
            sides["ort"] = ort_run
        times = {k: [] for k in sides}
        for _ in range(args.rounds):
            for k, fn in sides.items():
                times[k].append(_time(cp, fn, args.calls))
        us = {k: round(statistics.median(v), 2) for k, v in times.items()}
        row = {"case": name, "shape": list(shape), "dtype": dtype, "out": list(a.shape),
               "us": us, "generic_over_new": round(us["generic"] / us["new"], 2),
               "max_diff": diff}  # fmt: skip
        if "ort" in us:
            row["new_over_ort"] = round(us["new"] / us["ort"], 2)
        else:
            row["ort"] = why
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
