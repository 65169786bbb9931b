"""The CUDA decode GroupQueryAttention step, timed on the GPU; prints one JSON line per case.

    python bench/gpu_attention_bench.py [--shapes 0.5b,1.5b,d256]
        [--contexts 16,2000,8000,32000] [--capacity 32768] [--layers 24] [--batch 1]
        [--dtype float16] [--routes tensor-core,cuda-core] [--repeats 50]

Each case decodes one token over ``context`` tokens held in a fixed-capacity cache that
present shares with past, as ``onnxep.generate`` runs it (total_sequence_length is the
capacity, seqlens_k the context less one), with the attention geometry of Qwen2.5-0.5B
(14 query heads, 2 KV heads, head size 64), Qwen2.5-1.5B (12, 2, 128) or a head size of 256
(8, 1, 256), rotary on. The step is built through the kernel builder, as the executor
builds it, then ``--layers`` steps, each over its own cache as the layers of a model, are
captured in one CUDA graph and replayed; CUDA events time the replay, median of
``--repeats`` after warm-up, with L2 scrubbed before each replay (a model's weights stream
through it). ``--routes`` runs each case on each decode kernel (the CUDA-core kernel is
forced by reporting a device without fp16 mma to the builder), so both are measured in the
same process.

* ``us_per_call``: graph time / layers, the step's device time inside a graph (the decode
  kernel and, when the row is split, the merge kernel);
* ``kv_bytes``: the K and V bytes the step must read; ``bandwidth_tbs`` those over
  ``us_per_call``, and ``of_copy`` that against ``copy_tbs``, a device-to-device copy's
  bandwidth (bytes read plus written) measured in the same run;
* ``route`` and ``splits``: the kernel the builder chose, and the splits it uses at this
  context (decided on the device);
* ``eager_us``: events around one uncaptured call, the host's launch gaps included;
* ``kernels`` (with ``--trace``, where torch has CUPTI): each kernel of the replayed step,
  launches and device microseconds per layer, so the decode kernel's own time is told
  apart from the rotary/append and merge launches around it.
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

#: name: (query heads, KV heads, head size)
SHAPES = {"0.5b": (14, 2, 64), "1.5b": (12, 2, 128), "d256": (8, 1, 256)}
ROUTES = ("tensor-core", "cuda-core")


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


def copy_bandwidth(nbytes: int = 1 << 30, repeats: int = 20) -> float:
    """A device-to-device copy's bandwidth, TB/s of bytes read plus written."""
    import cupy

    src = cupy.ones(nbytes, dtype=np.uint8)
    dst = cupy.empty_like(src)
    rt, to, frm = cupy.cuda.runtime, dst.data.ptr, src.data.ptr

    def copy():
        rt.memcpyAsync(to, frm, nbytes, 3, cupy.cuda.get_current_stream().ptr)  # device to device

    for _ in range(3):
        copy()
    ms = _median_ms(cupy, copy, repeats)
    return 2 * nbytes / (ms * 1e-3) / 1e12


def _rope(cupy, rows: int, d: int, dt):
    inv = 1.0 / (10000 ** (np.arange(0, d, 2) / d))
    ang = np.arange(rows)[:, None] * inv[None, :]
    return cupy.asarray(np.cos(ang).astype(dt)), cupy.asarray(np.sin(ang).astype(dt))


def measure(
    shape: str = "0.5b",
    context: int = 2000,
    capacity: int = 32768,
    layers: int = 24,
    batch: int = 1,
    dtype: str = "float16",
    route: str = "tensor-core",
    repeats: int = 50,
    warmup: int = 10,
    copy_tbs: float | None = None,
    trace: bool = False,
    rotary: bool = True,
    scrub_l2: bool = True,
) -> dict:
    import cupy

    from onnxep.providers_cuda.ops import gqa_geometry as geom
    from onnxep.providers_cuda.ops import op_group_query_attention as gqa
    from onnxep.providers_cuda.ops.attention_cuda import sm_count

    nh, nkv, d = SHAPES[shape]
    dt = np.dtype(dtype)
    b = batch
    if not 1 <= context <= capacity:
        raise SystemExit(f"context {context} must be within 1..capacity ({capacity})")
    names = ["query", "key", "value", "past_key", "past_value", "seqlens_k",
             "total_sequence_length", "cos_cache", "sin_cache"]  # fmt: skip
    shapes = {
        "query": (b, 1, nh * d),
        "key": (b, 1, nkv * d),
        "value": (b, 1, nkv * d),
        "past_key": (b, nkv, capacity, d),
        "past_value": (b, nkv, capacity, d),
        "seqlens_k": (b,),
        "total_sequence_length": (),
        "cos_cache": (capacity, d // 2),
        "sin_cache": (capacity, d // 2),
    }
    rng = cupy.random.default_rng(0)
    cos, sin = _rope(cupy, capacity, d, dt)
    per_layer = []
    for _ in range(layers):
        args = [rng.standard_normal(shapes[n], dtype=np.float32).astype(dt) for n in names[:5]]
        args.append(cupy.full((b,), context - 1, dtype=np.int32))
        args.append(np.array(capacity, np.int32))  # a host input, as generate feeds it
        per_layer.append([*args, cos, sin])
    attrs = {"num_heads": nh, "kv_num_heads": nkv, "do_rotary": int(rotary)}
    node = _node(names, shapes, dt, attrs)
    real = gqa.compute_capability
    if route == "cuda-core":  # a device without fp16 mma, as far as the builder can tell
        gqa.compute_capability = lambda: 75
    try:
        run = gqa.group_query_attention(node, cupy)
    finally:
        gqa.compute_capability = real

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
        # larger than L2, or one byte when the experiment keeps L2 warm
        scrub = cupy.empty((256 << 20) if scrub_l2 else 1, dtype=np.uint8)
        graph_ms = _median_ms(cupy, lambda: graph.launch(stream), repeats, lambda: scrub.fill(1))
        kernels = _trace(cupy, graph, stream, scrub, layers) if trace else None

    (chosen,) = run.routes.values()
    if chosen.kernel == "tensor-core":
        geo = geom.plan_decode_tc(b, nh, nkv, d, capacity, sm_count())
        chunk, splits = geom.tc_splits(geo, context)
    else:
        geo = geom.plan_decode(b, nh, nkv, d, capacity, sm_count())
        chunk, splits = geom.decode_splits(geo, context)
    us = graph_ms * 1e3 / layers
    kv_bytes = 2 * b * nkv * context * d * dt.itemsize
    tbs = kv_bytes / (us * 1e-6) / 1e12
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
    row = {
        "bench": "gqa_decode_step",
        "device": props["name"].decode(),
        "shape": shape,
        "dtype": dt.name,
        "batch": b,
        "heads": nh,
        "kv_heads": nkv,
        "head_size": d,
        "context": context,
        "capacity": capacity,
        "route": chosen.kernel,
        "route_reason": chosen.reason,
        "grid_splits": geo.nsplit,
        "splits": splits,
        "chunk": chunk,
        "kv_bytes": kv_bytes,
        "us_per_call": round(us, 2),
        "eager_us": round(eager_ms * 1e3, 2),
        "bandwidth_tbs": round(tbs, 4),
        "layers": layers,
        "repeats": repeats,
        "rotary": rotary,
        "scrub_l2": scrub_l2,
    }
    if copy_tbs is not None:
        row["copy_tbs"] = round(copy_tbs, 3)
        row["of_copy"] = round(tbs / copy_tbs, 4)
    if kernels is not None:
        row["kernels"] = kernels
    return row


def latency_floor(layers: int = 24, grid: int = 264, repeats: int = 50) -> dict:
    """What a kernel costs in a graph when it does next to nothing: ``layers`` launches of
    ``grid`` blocks, block 0 reading one int of its own (L2 scrubbed) and writing one: the
    floor under each of the decode step's kernels."""
    import cupy

    touch = cupy.RawKernel(
        r"""extern "C" __global__ void touch(const int* a, int* b) {
          if (blockIdx.x == 0 && threadIdx.x == 0) b[0] = a[0] + 1;
        }""",
        "touch",
    )
    bufs = [(cupy.ones(64, np.int32), cupy.zeros(64, np.int32)) for _ in range(layers)]
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        for a, b in bufs:
            touch((grid,), (128,), (a, b))
        stream.begin_capture()
        for a, b in bufs:
            touch((grid,), (128,), (a, b))
        graph = stream.end_capture()
        scrub = cupy.empty(256 << 20, dtype=np.uint8)
        ms = _median_ms(cupy, lambda: graph.launch(stream), repeats, lambda: scrub.fill(1))
        kernels = _trace(cupy, graph, stream, scrub, layers)
    return {"bench": "kernel_floor", "grid": grid, "us_per_kernel": round(ms * 1e3 / layers, 2),
            "kernels": kernels}  # fmt: skip


def _trace(cupy, graph, stream, scrub, layers: int, replays: int = 8) -> list[dict] | None:
    """The replayed step's kernels by device time (CUPTI through torch's profiler)."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            scrub.fill(1)
            graph.launch(stream)
        stream.synchronize()
    per: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and "fill" not in e.name:
            per.setdefault(e.name, []).append(float(e.time_range.elapsed_us()))
    n = replays * layers
    rows = sorted(per.items(), key=lambda kv: -sum(kv[1]))
    return [
        {"kernel": k[:80], "per_layer": round(len(v) / n, 2), "us_per_layer": round(sum(v) / n, 2)}
        for k, v in rows[:8]
    ]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--shapes", default="0.5b,1.5b,d256", help=f"comma-separated, of {sorted(SHAPES)}"
    )
    p.add_argument("--contexts", default="16,2000,8000,32000")
    p.add_argument("--capacity", type=int, default=32768)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", default="float16", choices=["float16", "float32"])
    p.add_argument("--routes", default=",".join(ROUTES), help=f"comma-separated, of {ROUTES}")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--trace", action="store_true", help="each kernel's device time (CUPTI)")
    p.add_argument("--no-rotary", action="store_true", help="an experiment: do_rotary=0")
    p.add_argument("--no-scrub", action="store_true", help="an experiment: L2 kept warm")
    p.add_argument("--floor", action="store_true", help="also a do-nothing kernel's cost")
    p.add_argument(
        "--blocks-per-sm",
        type=int,
        default=None,
        help="an experiment: the tensor-core decode's blocks per SM (gqa_geometry's "
        "TC_BLOCKS_PER_SM, 2) for this run, to measure the split rule",
    )
    p.add_argument(
        "--tc-double",
        type=int,
        default=None,
        help="an experiment: the largest head size x rows the tensor-core decode "
        "double-buffers (decode_tc_cuda's TC_DOUBLE_MAX, 512) for this run",
    )
    a = p.parse_args(argv)
    if a.tc_double is not None:
        from onnxep.providers_cuda.ops import decode_tc_cuda

        decode_tc_cuda.TC_DOUBLE_MAX = a.tc_double
    if a.blocks_per_sm is not None:
        from onnxep.providers_cuda.ops import gqa_geometry

        gqa_geometry.TC_BLOCKS_PER_SM = a.blocks_per_sm
    shapes, routes = a.shapes.split(","), a.routes.split(",")
    unknown = sorted(set(shapes) - set(SHAPES)) + sorted(set(routes) - set(ROUTES))
    if unknown:
        p.error(f"unknown shape or route {unknown}; known: {sorted(SHAPES)}, {ROUTES}")
    contexts = [int(c) for c in a.contexts.split(",")]
    if min(contexts) < 1 or max(contexts) > a.capacity:
        p.error(f"--contexts must lie within 1..--capacity ({a.capacity})")
    copy_tbs = copy_bandwidth()
    print(json.dumps({"bench": "d2d_copy", "copy_tbs": round(copy_tbs, 3)}), flush=True)
    if a.floor:
        print(json.dumps(latency_floor(a.layers)), flush=True)
    for shape in shapes:
        for route in routes:
            for ctx in contexts:
                row = measure(shape, ctx, a.capacity, a.layers, a.batch, a.dtype, route,
                              a.repeats, a.warmup, copy_tbs, a.trace, not a.no_rotary,
                              not a.no_scrub)  # fmt: skip
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
