"""The CUDA decode GroupQueryAttention step, timed on the GPU; prints one JSON line per case.

    python bench/gpu_attention_bench.py [--models 0.5b,1.5b] [--contexts 16,512,2000,8000]
        [--capacity 8192] [--layers 24] [--batch 1] [--dtype float16] [--repeats 50]

Each case decodes one token over ``context`` tokens held in a fixed-capacity
cache that present shares with past, as ``onnxep.generate`` runs it
(total_sequence_length is the capacity, seqlens_k the context less one), with
the attention geometry of Qwen2.5-0.5B (14 query heads, 2 KV heads, head size
64) or Qwen2.5-1.5B (12, 2, 128), rotary off. The step is built through the
kernel builder, as the executor builds it, then ``--layers`` steps, each over
its own cache as the layers of a model, are captured in one CUDA graph and
replayed; CUDA events time the replay, median of ``--repeats`` after warm-up,
with L2 scrubbed before each replay (a model's weights stream through it).

* ``us_per_call``: graph time / layers, the step's device time inside a graph;
* ``bandwidth_tbs``: the K and V bytes one step must read over that time, and
  ``of_peak`` that against the 4.26 TB/s the H200 reaches in a device-to-device
  copy (GPU.md);
* ``splits``: the splits the kernel uses at this context (decided on the device);
* ``eager_us``: events around one uncaptured call, the host's launch gaps included.
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

PEAK_TBS = 4.26
#: name: (query heads, KV heads, head size)
MODELS = {"0.5b": (14, 2, 64), "1.5b": (12, 2, 128)}


def _node(names, shapes, dtype, attrs):
    from onnxep.providers.node import NodeInfo, ValueInfo

    ints = ("seqlens_k", "total_sequence_length")
    ins = tuple(
        ValueInfo(n, "tensor", np.dtype(np.int32 if n in ints else dtype), shapes[n]) for n in names
    )
    outs = tuple(ValueInfo(n, "tensor") for n in ("output", "present_key", "present_value"))
    return NodeInfo("GroupQueryAttention", "com.microsoft", "bench", 1, attrs, ins, outs)


def _median_ms(cupy, fn, repeats: int, before=None) -> float:
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def measure(
    model: str = "0.5b",
    context: int = 2000,
    capacity: int = 8192,
    layers: int = 24,
    batch: int = 1,
    dtype: str = "float16",
    repeats: int = 50,
    warmup: int = 10,
) -> dict:
    import cupy

    from onnxep.providers_cuda.ops.attention_cuda import sm_count
    from onnxep.providers_cuda.ops.gqa_geometry import decode_splits, plan_decode
    from onnxep.providers_cuda.ops.op_group_query_attention import group_query_attention

    nh, nkv, d = MODELS[model]
    dt = np.dtype(dtype)
    b = batch
    if not 1 <= context <= capacity:
        raise SystemExit(f"context {context} must be within 1..capacity ({capacity})")
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
    per_layer = []
    for _ in range(layers):
        args = [rng.standard_normal(shapes[n], dtype=np.float32).astype(dt) for n in names[:5]]
        args.append(cupy.full((b,), context - 1, dtype=np.int32))
        args.append(np.array(capacity, np.int32))  # a host input, as generate feeds it
        per_layer.append(args)
    node = _node(names, shapes, dt, {"num_heads": nh, "kv_num_heads": nkv})
    run = group_query_attention(node, cupy)

    def model_step():
        for args in per_layer:
            run(*args)

    stream = cupy.cuda.Stream(non_blocking=True)
    pool = cupy.cuda.MemoryPool()  # the graph's temporaries are never handed to anyone else
    with cupy.cuda.using_allocator(pool.malloc), stream:
        for _ in range(warmup):
            model_step()
        stream.synchronize()
        eager_ms = _median_ms(cupy, lambda: run(*per_layer[0]), repeats)
        stream.begin_capture()
        model_step()
        graph = stream.end_capture()
        for _ in range(warmup):
            graph.launch(stream)
        scrub = cupy.empty(256 << 20, dtype=np.uint8)  # larger than L2
        graph_ms = _median_ms(cupy, lambda: graph.launch(stream), repeats, lambda: scrub.fill(1))

    geo = plan_decode(b, nh, nkv, d, capacity, sm_count())
    chunk, splits = decode_splits(geo, context)
    us = graph_ms * 1e3 / layers
    kv_bytes = 2 * b * nkv * context * d * dt.itemsize
    tbs = kv_bytes / (us * 1e-6) / 1e12
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
    return {
        "bench": "gqa_decode_step",
        "device": props["name"].decode(),
        "model": model,
        "dtype": dt.name,
        "batch": b,
        "heads": nh,
        "kv_heads": nkv,
        "head_size": d,
        "context": context,
        "capacity": capacity,
        "splits": splits,
        "chunk": chunk,
        "kv_bytes": kv_bytes,
        "us_per_call": round(us, 2),
        "eager_us": round(eager_ms * 1e3, 2),
        "bandwidth_tbs": round(tbs, 4),
        "of_peak": round(tbs / PEAK_TBS, 4),
        "layers": layers,
        "repeats": repeats,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="0.5b,1.5b", help=f"comma-separated, of {sorted(MODELS)}")
    p.add_argument("--contexts", default="16,512,2000,8000")
    p.add_argument("--capacity", type=int, default=8192)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="float16", choices=["float16", "float32"])
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    a = p.parse_args(argv)
    models = a.models.split(",")
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        p.error(f"unknown model {unknown}; known: {sorted(MODELS)}")
    contexts = [int(c) for c in a.contexts.split(",")]
    if min(contexts) < 1:
        p.error("--contexts must be positive")
    for model in models:
        for ctx in contexts:
            row = measure(model, ctx, a.capacity, a.layers, a.batch, a.dtype, a.repeats, a.warmup)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
