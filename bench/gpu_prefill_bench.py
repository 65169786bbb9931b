"""The attention prefill on the GPU: the tensor-core kernel beside the tiled one it replaces.

    python bench/gpu_prefill_bench.py [--lengths 128,512,2000,8000]
        [--heads 14/2/64,12/2/128,8/1/256] [--dtypes float16,bfloat16] [--batch 1]
        [--repeats 20] [--tiled-max 8000] [--bidirectional] [--no-torch] [--json out.jsonl]

Per head shape (query heads / KV heads / head size), length and dtype, one JSON line:

* ``flash_ms``: the tensor-core kernel alone (``_flash_prefill.plan``), a first prompt of
  ``length`` tokens per batch row (causal, and ``--bidirectional`` adds non-causal rows),
  in the tile shape the plan picks (``flash_tiles``); ``flash_tflops``: its useful FLOPs
  (4 * D per attended query-key pair: Q.K^T and P.V) over that time; up to head size 64
  ``flash_ms_1tile`` / ``flash_ms_2tile`` time both shapes (one or two m16 tiles per warp),
  so the plan's rule (``_flash_prefill.m_tiles``) can be checked;
* ``step_flash_ms`` / ``step_tiled_ms``: GroupQueryAttention's whole prefill step (packed
  QKV in, rotary, cache append, attention) through ``_gqa_step.plan_step`` with the
  tensor-core kernel and with the tiled one (float16; the tiled one only up to
  ``--tiled-max`` tokens, it is slow), and ``speedup`` between the two;
* ``torch_sdpa_ms`` / ``torch_tflops``: torch's ``scaled_dot_product_attention`` (its
  FlashAttention/cuDNN kernels, GQA through ``enable_gqa``) on the same shapes, where
  torch with CUDA is installed: a peer measured in the same process.

A first line reports the dense float16 GEMM rate measured in the same run (cuBLAS, 8192^3
through ``providers_cuda.blas``), the ceiling the TFLOP/s figures compare against. Times
are CUDA-event medians of ``--repeats`` launches after warm-up.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np

#: (query heads, KV heads, head size) of named shapes, for --heads.
SHAPES = {"0.5b": (14, 2, 64), "1.5b": (12, 2, 128), "h256": (8, 1, 256)}


def attended_pairs(s: int, causal: bool) -> int:
    """Query-key pairs a first prompt of ``s`` tokens attends."""
    return s * (s + 1) // 2 if causal else s * s


def attention_flops(b: int, nh: int, d: int, s: int, causal: bool) -> int:
    """Useful FLOPs of a prefill: 2 * D for Q.K^T and 2 * D for P.V per attended pair."""
    return 4 * d * nh * b * attended_pairs(s, causal)


def parse_heads(text: str) -> list[tuple[int, int, int]]:
    out = []
    for item in text.split(","):
        item = item.strip()
        if item in SHAPES:
            out.append(SHAPES[item])
            continue
        parts = item.split("/")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise ValueError(
                f"--heads item {item!r}: use NH/NKV/D (e.g. 14/2/64) or {sorted(SHAPES)}"
            )
        nh, nkv, d = (int(p) for p in parts)
        if nh % nkv:
            raise ValueError(f"--heads item {item!r}: query heads must be a multiple of KV heads")
        out.append((nh, nkv, d))
    return out


def _events_ms(cupy: Any, fn, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
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


def gemm_tflops(cupy: Any, n: int = 8192, repeats: int = 10) -> float:
    from onnxep.providers_cuda import blas

    a = cupy.random.standard_normal((n, n), dtype=np.float32).astype(np.float16)
    b = cupy.random.standard_normal((n, n), dtype=np.float32).astype(np.float16)
    out = cupy.empty((n, n), np.float16)
    ms = _events_ms(cupy, lambda: blas.gemm(a, b, out=out), repeats)
    return 2 * n**3 / (ms * 1e-3) / 1e12


def build_flash(xp, kernels, dt, b, nh, nkv, d, s, causal, rand, sms=1, tiles=None):
    """The kernel alone, one call: Q (B, Hq, S, D), caches (B, Hkv, S, D), first prompts of
    s tokens; ``rand(shape)`` makes inputs (bfloat16 as their bits); ``tiles`` m16 tiles per
    warp (None: the plan's choice on ``sms`` SMs). Returns the call (``call.geometry``)."""
    from onnxep.providers_cuda.ops import _flash_prefill as fp

    store = np.uint16 if dt.name == "bfloat16" else dt  # CuPy has no bfloat16: its bits
    q, k, v = rand((b, nh, s, d)), rand((b, nkv, s, d)), rand((b, nkv, s, d))
    y = xp.empty((b, s, nh * d), store)
    seqlens = xp.full((b,), s - 1, np.int32)
    kv = (nkv * s * d, s * d, d)
    run = fp.plan(
        kernels, xp, dt, b=b, nh=nh, nkv=nkv, d=d, sq=s, sk=s,
        q_strides=(nh * s * d, s * d, d), k_strides=kv, v_strides=kv,
        y_strides=(s * nh * d, d, nh * d), mode=fp.MODE_GQA, causal=causal,
        scale=1.0 / math.sqrt(d), kv_limit=s, sms=sms, tiles=tiles,
    )  # fmt: skip
    args = (q, k, v, seqlens, None, None, None, None, None, None, None, y)

    def call():
        if not run(*args):
            raise RuntimeError("the flash kernel declined its (aligned) arrays")
        return y

    call.geometry = run.geometry
    return call


def build_step(xp, dt, b, nh, nkv, d, s, causal, flash, rand, sms):
    """GroupQueryAttention's prefill step (packed QKV, rotary, cache append, attention) with
    the tensor-core kernel (``flash``: a ``_flash_prefill.Kernels``) or the tiled one (None).
    Returns (the call, giving the step's outputs, and the step's route)."""
    from onnxep.providers_cuda.ops._attention_cuda import kernels_by_dtype
    from onnxep.providers_cuda.ops._gqa_cuda import GQA_SOURCE, KERNEL_NAMES, NAME_EXPRESSIONS
    from onnxep.providers_cuda.ops._gqa_step import plan_step
    from onnxep.providers_cuda.ops.op_group_query_attention import GqaConfig

    cfg = GqaConfig(num_heads=nh, kv_num_heads=nkv, scale=0.0, softcap=0.0, window=-1,
                    causal=causal, do_rotary=True, interleaved=False, smooth=False)  # fmt: skip
    fns = kernels_by_dtype(GQA_SOURCE, KERNEL_NAMES, NAME_EXPRESSIONS, dt)
    qkv = rand((b, s, (nh + 2 * nkv) * d))
    past = xp.zeros((b, nkv, 0, d), dt)
    ang = np.arange(s)[:, None] / (10000 ** (np.arange(0, d, 2) / d))[None, :]
    cos, sin = xp.asarray(np.cos(ang).astype(dt)), xp.asarray(np.sin(ang).astype(dt))
    seqlens = xp.full((b,), s - 1, np.int32)
    ins = [qkv, None, None, past, past, seqlens, cos, sin, None, None, None, None]
    step = plan_step(cfg, fns, sms, xp, s, ins, flash)
    return (lambda: step(list(ins))), step.route


def _randn(cupy, dt):
    rng = cupy.random.default_rng(0)

    def rand(shape):
        x = rng.standard_normal(shape, dtype=np.float32)
        if dt.name == "bfloat16":  # bf16 bits of x (truncated: the values only need to be sane)
            return (x.view(np.uint32) >> 16).astype(np.uint16)
        return x.astype(dt)

    return rand


def _torch_case(torch, dt, b, nh, nkv, d, s, causal, repeats):
    import torch.nn.functional as F

    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dt.name]
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn((b, nh, s, d), device="cuda", dtype=tdt, generator=g)
    k = torch.randn((b, nkv, s, d), device="cuda", dtype=tdt, generator=g)
    v = torch.randn((b, nkv, s, d), device="cuda", dtype=tdt, generator=g)

    def run():
        F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=nkv != nh)

    for _ in range(3):
        run()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="128,512,2000,8000")
    p.add_argument("--heads", default="0.5b,1.5b,h256", help=f"NH/NKV/D items or {sorted(SHAPES)}")
    p.add_argument("--dtypes", default="float16,bfloat16")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument(
        "--tiled-max", type=int, default=8000, help="longest prompt the tiled kernel runs"
    )
    p.add_argument("--bidirectional", action="store_true", help="non-causal rows too")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--json", type=Path, help="also write the JSON lines here")
    a = p.parse_args(argv)
    try:
        heads = parse_heads(a.heads)
        lengths = [int(x) for x in a.lengths.split(",")]
    except ValueError as exc:
        p.error(str(exc))
    if min(lengths) < 1 or a.batch < 1 or a.repeats < 1:
        p.error("--lengths, --batch and --repeats must be positive")
    import cupy
    import ml_dtypes  # noqa: F401 - registers numpy's "bfloat16"

    from onnxep.providers_cuda.ops import _flash_prefill as fp
    from onnxep.providers_cuda.ops._attention_cuda import sm_count

    sms = sm_count()
    torch = None if a.no_torch else _torch()
    sink = a.json.open("w") if a.json else None

    def emit(row):
        line = json.dumps(row)
        print(line, flush=True)
        if sink:
            sink.write(line + "\n")

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.runtime.getDevice())
    gemm = gemm_tflops(cupy)
    emit({"bench": "dense_fp16_gemm", "device": props["name"].decode(), "n": 8192,
          "tflops": round(gemm, 1)})  # fmt: skip
    kernels = fp.Kernels("bench")
    for nh, nkv, d in heads:
        for dtype in a.dtypes.split(","):
            dt = np.dtype(dtype)
            route = kernels.route(dt, d)
            for s in lengths:
                for causal in (True, False) if a.bidirectional else (True,):
                    flops = attention_flops(a.batch, nh, d, s, causal)
                    row: dict[str, Any] = {
                        "bench": "attention_prefill", "dtype": dt.name, "batch": a.batch,
                        "heads": nh, "kv_heads": nkv, "head_size": d, "length": s,
                        "causal": causal, "gflop": round(flops / 1e9, 3), "route": route.reason,
                    }  # fmt: skip
                    shape = (dt, a.batch, nh, nkv, d, s, causal)
                    if route.flash:
                        call = build_flash(cupy, kernels, *shape, _randn(cupy, dt), sms)
                        ms = _events_ms(cupy, call, a.repeats)
                        tf = flops / (ms * 1e-3) / 1e12
                        row.update(flash_ms=round(ms, 4), flash_tflops=round(tf, 1),
                                   of_dense_gemm=round(tf / gemm, 3),
                                   flash_tiles=call.geometry.describe())  # fmt: skip
                        if d <= fp.MAX_TWO_TILE_HEAD:  # both tile shapes, to check the choice
                            for mt in (1, 2):
                                c = build_flash(cupy, kernels, *shape, _randn(cupy, dt), sms, mt)
                                row[f"flash_ms_{mt}tile"] = round(_events_ms(cupy, c, a.repeats), 4)
                    if dt.name == "float16":
                        call, r = build_step(cupy, *shape, kernels, _randn(cupy, dt), sms)
                        sf = _events_ms(cupy, call, a.repeats)
                        row.update(step_flash_ms=round(sf, 4), step_route=r.path)
                        if s <= a.tiled_max:
                            reps = max(1, a.repeats // 4) if s > 2000 else a.repeats
                            call, _ = build_step(cupy, *shape, None, _randn(cupy, dt), sms)
                            st = _events_ms(cupy, call, reps)
                            row.update(step_tiled_ms=round(st, 4),
                                       tiled_tflops=round(flops / (st * 1e-3) / 1e12, 2),
                                       speedup=round(st / sf, 2))  # fmt: skip
                    if torch is not None:
                        tm = _torch_case(torch, dt, a.batch, nh, nkv, d, s, causal, a.repeats)
                        row.update(torch_sdpa_ms=round(tm, 4),
                                   torch_tflops=round(flops / (tm * 1e-3) / 1e12, 1))  # fmt: skip
                    emit(row)
    if sink:
        sink.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
