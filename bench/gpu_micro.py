"""Host cost per launch on the GPU machine: where the microseconds of an elementwise node go.

    python bench/gpu_micro.py [OUT_JSON]

Times, per call on 4-element float32 arrays (so the GPU work is nil): a CuPy
ufunc allocating its output, the same with ``out=``, ``cupy.empty``, one of
onnxep's raw kernels launched through CuPy and through the driver
(launch.Launcher), and the CUDA provider's Add kernel as the executor calls it.
"""

from __future__ import annotations

import json
import sys
import time

import cupy
import numpy as np


def per_call_us(fn, n=20000):
    for _ in range(200):
        fn()
    cupy.cuda.get_current_stream().synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    cupy.cuda.get_current_stream().synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def main() -> dict:
    from onnxep.providers_cuda import elementwise, nvrtc
    from onnxep.providers_cuda.launch import Launcher

    a = cupy.ones(4, cupy.float32)
    b = cupy.ones(4, cupy.float32)
    c = cupy.empty(4, cupy.float32)
    fn = nvrtc.function(elementwise.SOURCE, "add_k<float>", name_expressions=elementwise.NAMES)
    via_cupy = Launcher(fn, "pppqqqqq", use_driver=False)
    direct = Launcher(fn, "pppqqqqq")
    args = (a.data.ptr, b.data.ptr, c.data.ptr, 4, 1, 4, 1, 4)
    sp = cupy.cuda.get_current_stream().ptr
    run = elementwise.binary_runner("add", lambda x, y: (x + y,))
    from cupy_backends.cuda import stream as stream_module

    res = {
        "piece_flags_c_contiguous": per_call_us(lambda: a.flags.c_contiguous),
        "piece__c_contiguous": per_call_us(lambda: getattr(a, "c_contiguous", None)),
        "piece_dtype_name": per_call_us(lambda: a.dtype.name),
        "piece_data_ptr": per_call_us(lambda: a.data.ptr),
        "piece_get_current_stream_ptr": per_call_us(
            lambda: getattr(stream_module, "get_current_stream_ptr", lambda: 0)()
        ),
        "piece_current_stream_obj_ptr": per_call_us(lambda: cupy.cuda.get_current_stream().ptr),
        "cupy_ufunc_alloc": per_call_us(lambda: cupy.add(a, b)),
        "cupy_ufunc_out": per_call_us(lambda: cupy.add(a, b, out=c)),
        "cupy_empty": per_call_us(lambda: cupy.empty(4, cupy.float32)),
        "raw_kernel_via_cupy": per_call_us(lambda: via_cupy(1, 256, args, sp)),
        "raw_kernel_via_driver": per_call_us(lambda: direct(1, 256, args, sp)),
        "onnxep_add_kernel": per_call_us(lambda: run(a, b)),
        "driver_launch_used": direct.direct,
    }
    np.testing.assert_array_equal(run(a, b)[0].get(), np.full(4, 2, np.float32))
    return res


if __name__ == "__main__":
    out = main()
    for k, v in out.items():
        print(f"{k:24s} {v:.2f} us" if isinstance(v, float) else f"{k:24s} {v}")
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)
