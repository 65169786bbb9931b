"""MatMulNBits at prefill row counts on the GPU: GEMV launches of 8 rows against dequantise +
cuBLAS, so the threshold between them (``op_matmul_nbits.gemv_rows``) can be checked.

    python bench/gpu_nbits_prefill_bench.py [--shapes 0.5b,1.5b]
        [--rows 1,8,9,16,24,32,64,128,512,2000] [--dtypes float16,float32] [--repeats 20]
        [--gemv-max 2000] [--json out.jsonl]

Per projection of the named model shapes (Qwen2.5's packed QKV, output, gate+up, down and
LM head as MatMulNBits with 4-bit weights in blocks of 32), activation dtype (float32
activations use ``accuracy_level=4``, the factory's and the CPU builder's, whose int8
rounding makes the dequantised weight float32 too) and row count M, one JSON line:
``gemv_ms`` (the GEMV once per 8 rows, forced), ``gemm_ms`` (the weight dequantised in
tiles into scratch, one cuBLAS GEMM per tile, forced), ``routed_ms`` (what the op runs:
``route``), ``faster`` of the two, the op's threshold ``gemv_rows``, ``dense_ms`` (one
cuBLAS GEMM on an already dense weight of A's dtype: the floor of the GEMM path) and
``scratch_mb`` (what the dequantisation held at most: the pool's high-water mark over the
call less the output). CUDA-event medians of ``--repeats`` calls after warm-up.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np

#: (hidden, intermediate, vocabulary) of the named shapes; heads give the QKV width.
MODELS = {"0.5b": (896, 4864, 151936, 14, 2, 64), "1.5b": (1536, 8960, 151936, 12, 2, 128)}


def projections(name: str) -> list[tuple[str, int, int]]:
    """(projection, K, N) of one decoder layer and the LM head."""
    h, inter, vocab, nh, nkv, d = MODELS[name]
    return [
        ("qkv", h, (nh + 2 * nkv) * d),
        ("o_proj", nh * d, h),
        ("gate_up", h, 2 * inter),
        ("down", inter, h),
        ("lm_head", h, vocab),
    ]


def nbits_node(k: int, n: int, dtype: np.dtype, accuracy_level: int, rng):
    """A MatMulNBits node with constant random 4-bit weights (blocks of 32, no zero points)."""
    from onnxep.providers.node import NodeInfo, ValueInfo

    block, kb = 32, -(-k // 32)
    b = rng.integers(0, 256, (n, kb, block // 2), dtype=np.uint8)
    scales = (rng.random(n * kb) * 0.02 + 0.001).astype(dtype)
    ins = (
        ValueInfo("a", "tensor", np.dtype(dtype), ("m", k)),
        ValueInfo("b", "tensor", np.dtype(np.uint8), b.shape, b),
        ValueInfo("scales", "tensor", np.dtype(dtype), scales.shape, scales),
    )
    attrs = {"K": k, "N": n, "bits": 4, "block_size": block, "accuracy_level": accuracy_level}
    return NodeInfo("MatMulNBits", "com.microsoft", "bench", 1, attrs, ins,
                    (ValueInfo("y", "tensor"),))  # fmt: skip


def _ms(cupy: Any, fn, repeats: int) -> float:
    for _ in range(2):
        fn()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def measure(cupy, xp, runner, k, n, m, dtype, repeats, gemv_max) -> dict[str, Any]:
    from onnxep.providers_cuda import blas

    a = cupy.random.standard_normal((m, k), dtype=np.float32).astype(dtype)
    threshold = runner.gemv_rows
    row: dict[str, Any] = {"gemv_rows": threshold,
                           "route": "gemv" if m <= threshold else "gemm"}  # fmt: skip
    row["routed_ms"] = round(_ms(cupy, lambda: runner(a), repeats), 4)
    try:
        if m <= gemv_max:
            runner.gemv_rows = 1 << 30  # force the GEMV, a launch per 8 rows
            row["gemv_ms"] = round(_ms(cupy, lambda: runner(a), repeats), 4)
        if m > 8:  # the GEMV's own rows run no GEMM
            runner.gemv_rows = 0  # force dequantise + cuBLAS
            row["gemm_ms"] = round(_ms(cupy, lambda: runner(a), repeats), 4)
            pool = cupy.cuda.MemoryPool()
            with cupy.cuda.using_allocator(pool.malloc):
                y = runner(a)[0]
                cupy.cuda.get_current_stream().synchronize()
                held = pool.total_bytes() - y.nbytes
            row["scratch_mb"] = round(held / 2**20, 2)
    finally:
        runner.gemv_rows = threshold
    if "gemv_ms" in row and "gemm_ms" in row:
        row["faster"] = "gemv" if row["gemv_ms"] < row["gemm_ms"] else "gemm"
    w = cupy.random.standard_normal((n, k), dtype=np.float32).astype(dtype)
    row["dense_ms"] = round(_ms(cupy, lambda: blas.gemm(a, w, trans_b=True), repeats), 4)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="0.5b,1.5b")
    p.add_argument("--rows", default="1,8,9,16,24,32,64,128,512,2000")
    p.add_argument("--dtypes", default="float16,float32")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--gemv-max", type=int, default=2000, help="most rows the forced GEMV runs")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    shapes = a.shapes.split(",")
    if set(shapes) - set(MODELS):
        p.error(f"--shapes: one of {sorted(MODELS)}")
    rows = [int(x) for x in a.rows.split(",")]
    import cupy

    from onnxep.providers_cuda.ops.op_matmul_nbits import matmul_nbits
    from onnxep.providers_cuda.xp import cuda_namespace

    xp = cuda_namespace()
    rng = np.random.default_rng(0)
    sink = a.json.open("w") if a.json else None
    for shape in shapes:
        for proj, k, n in projections(shape):
            for dtype in a.dtypes.split(","):
                dt = np.dtype(dtype)
                level = 4 if dt == np.float32 else 0
                runner = matmul_nbits(nbits_node(k, n, dt, level, rng), xp)
                for m in rows:
                    got = measure(cupy, xp, runner, k, n, m, dt, a.repeats, a.gemv_max)
                    row = {"bench": "matmul_nbits_prefill", "shape": shape, "projection": proj,
                           "K": k, "N": n, "dtype": dt.name, "accuracy_level": level, "M": m,
                           **got}  # fmt: skip
                    line = json.dumps(row)
                    print(line, flush=True)
                    if sink:
                        sink.write(line + "\n")
                del runner
                cupy.get_default_memory_pool().free_all_blocks()
    if sink:
        sink.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
