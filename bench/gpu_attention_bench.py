"""The CUDA decode GroupQueryAttention step, timed on the GPU; prints one JSON line.

    python bench/gpu_attention_bench.py [--context 2000] [--capacity 2048] [--heads 14]
        [--kv-heads 2] [--head-size 64] [--batch 1] [--dtype float16] [--repeats 100]

Defaults are Qwen2.5-0.5B's attention (14 query heads, 2 KV heads, head size
64, float16, batch 1) decoding one token over 2000 tokens of context held in a
fixed-capacity cache that present shares with past. The step (rotary off:
prepare, split-K decode, reduce) is built through the kernel builder and timed
with CUDA events, median of ``--repeats`` after warm-up, two ways:

* ``eager_ms``: events around one call as the executor would make it, so the
  host's launch gaps count;
* ``graph_ms``: the same step captured once as a CUDA graph and replayed,
  i.e. device time alone. ``bandwidth_tbs`` is the K and V bytes the step
  must read divided by it, and ``of_peak`` that against the 4.26 TB/s the
  H200 reaches in a device-to-device copy (GPU.md).

``host_us`` is the Python/launch cost of one call (no synchronization).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

PEAK_TBS = 4.26


def _node(names, shapes, dtype, attrs):
    from onnxep.providers.node import NodeInfo, ValueInfo

    ints = ("seqlens_k", "total_sequence_length")
    ins = tuple(
        ValueInfo(n, "tensor", np.dtype(np.int32 if n in ints else dtype), shapes[n]) for n in names
    )
    outs = tuple(ValueInfo(n, "tensor") for n in ("output", "present_key", "present_value"))
    return NodeInfo("GroupQueryAttention", "com.microsoft", "bench", 1, attrs, ins, outs)


def _median_ms(cupy, fn, repeats: int) -> float:
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def measure(
    context: int = 2000,
    capacity: int = 2048,
    heads: int = 14,
    kv_heads: int = 2,
    head_size: int = 64,
    batch: int = 1,
    dtype: str = "float16",
    repeats: int = 100,
    warmup: int = 20,
) -> dict:
    import cupy

    from onnxep.providers_cuda.ops._attention_cuda import sm_count
    from onnxep.providers_cuda.ops._gqa_geometry import plan_decode
    from onnxep.providers_cuda.ops.op_group_query_attention import group_query_attention

    if context > capacity:
        raise SystemExit(f"--context {context} exceeds --capacity {capacity}")
    dt = np.dtype(dtype)
    b, nh, nkv, d = batch, heads, kv_heads, head_size
    names = ["query", "key", "value", "past_key", "past_value", "seqlens_k"]
    names.append("total_sequence_length")
    shapes = {
        "query": (b, 1, nh * d),
        "key": (b, 1, nkv * d),
        "value": (b, 1, nkv * d),
        "past_key": (b, nkv, capacity, d),
        "past_value": (b, nkv, capacity, d),
        "seqlens_k": (b,),
        "total_sequence_length": (),
    }
    rng = cupy.random.default_rng(0)
    args = [rng.standard_normal(shapes[n], dtype=np.float32).astype(dt) for n in names[:5]]
    args.append(cupy.full((b,), context - 1, dtype=np.int32))
    args.append(np.array(context, np.int32))  # a host input
    node = _node(names, shapes, dt, {"num_heads": nh, "kv_num_heads": nkv})
    run = group_query_attention(node, cupy)

    def step():
        run(*args)

    stream = cupy.cuda.Stream(non_blocking=True)
    pool = cupy.cuda.MemoryPool()  # the graph's temporaries are never handed to anyone else
    with cupy.cuda.using_allocator(pool.malloc), stream:
        for _ in range(warmup):
            step()
        stream.synchronize()
        t0 = time.perf_counter()
        for _ in range(repeats):
            step()
        host_us = (time.perf_counter() - t0) / repeats * 1e6
        stream.synchronize()
        eager_ms = _median_ms(cupy, step, repeats)
        stream.begin_capture()
        step()
        graph = stream.end_capture()
        for _ in range(warmup):
            graph.launch(stream)
        graph_ms = _median_ms(cupy, lambda: graph.launch(stream), repeats)

    geo = plan_decode(b, 1, nh, nkv, d, capacity, sm_count())
    kv_bytes = 2 * b * nkv * context * d * dt.itemsize
    tbs = kv_bytes / (graph_ms * 1e-3) / 1e12
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
    return {
        "bench": "gqa_decode_step",
        "device": props["name"].decode(),
        "dtype": dt.name,
        "batch": b,
        "heads": nh,
        "kv_heads": nkv,
        "head_size": d,
        "context": context,
        "capacity": capacity,
        "chunks": geo.nchunks,
        "chunk": geo.chunk,
        "kv_bytes": kv_bytes,
        "eager_ms": round(eager_ms, 5),
        "graph_ms": round(graph_ms, 5),
        "host_us": round(host_us, 2),
        "bandwidth_tbs": round(tbs, 4),
        "of_peak": round(tbs / PEAK_TBS, 4),
        "repeats": repeats,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--context", type=int, default=2000)
    p.add_argument("--capacity", type=int, default=2048)
    p.add_argument("--heads", type=int, default=14)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-size", type=int, default=64)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="float16", choices=["float16", "float32"])
    p.add_argument("--repeats", type=int, default=100)
    p.add_argument("--warmup", type=int, default=20)
    a = p.parse_args(argv)
    shape = (a.context, a.capacity, a.heads, a.kv_heads, a.head_size, a.batch, a.dtype)
    print(json.dumps(measure(*shape, repeats=a.repeats, warmup=a.warmup)))


if __name__ == "__main__":
    main()
