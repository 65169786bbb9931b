"""The prefill benchmarks' own logic, without a GPU.

bench/gpu_prefill_profile.py runs end to end on the CPU provider with the
factory's tiny decoder beside onnxruntime's CPU provider (the same code path the
GPU run takes, CuPy aside); bench/gpu_prefill_bench.py's two builders (the
tensor-core kernel alone, and GroupQueryAttention's prefill step with either
kernel) run on the CUDA emulator and must agree with each other; the FLOP
counts and argument parsing are checked by hand.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from cuda_emulation import Emulator, available, nan_empty

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench/ is imported from the repo root, not installed
from bench import gpu_nbits_prefill_bench, gpu_prefill_bench, gpu_prefill_profile  # noqa: E402


def test_profile_runs_end_to_end_on_the_cpu(tmp_path):
    out = tmp_path / "rows.jsonl"
    rc = gpu_prefill_profile.main([
        "--make", "tiny:fp32", "--models-dir", str(tmp_path), "--lengths", "9,24",
        "--tokens-at", "24", "--steps", "3", "--providers", "cpu", "--vs", "onnxruntime",
        "--repeats", "1", "--json", str(out),
    ])  # fmt: skip
    assert rc == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    kinds = [r["bench"] for r in rows]
    assert kinds == ["prefill", "prefill_ops", "prefill", "prefill_ops", "decode"]
    prefill = [r for r in rows if r["bench"] == "prefill"]
    assert [r["length"] for r in prefill] == [9, 24]
    assert all(r["onnxep_ms"] > 0 and r["onnxruntime_ms"] > 0 and "ratio" in r for r in prefill)
    ops = {o["op"]: o for o in rows[1]["ops"]}
    assert ops["GroupQueryAttention"]["count"] == 2  # the tiny decoder's two layers
    assert abs(sum(o["share"] for o in ops.values()) - 1) < 0.01
    (decode,) = [r for r in rows if r["bench"] == "decode"]
    assert len(decode["onnxep_tokens"]) == 3 and decode["tokens_equal"] is True


def test_profile_needs_a_model():
    with pytest.raises(SystemExit):
        gpu_prefill_profile.main(["--providers", "cpu"])


def test_attention_flops_count_each_attended_pair_once():
    # 3 tokens causal: pairs (0,0) (1,0) (1,1) (2,0) (2,1) (2,2); 4 * D FLOPs each per head
    assert gpu_prefill_bench.attention_flops(1, 2, 64, 3, True) == 4 * 64 * 2 * 6
    assert gpu_prefill_bench.attention_flops(2, 2, 64, 3, False) == 4 * 64 * 2 * 2 * 9
    # 2000 tokens of Qwen2.5-0.5B's 14 heads: about 7.2 GFLOP per layer
    assert round(gpu_prefill_bench.attention_flops(1, 14, 64, 2000, True) / 1e9, 1) == 7.2


def test_heads_parse_names_and_triples():
    assert gpu_prefill_bench.parse_heads("0.5b,12/2/128") == [(14, 2, 64), (12, 2, 128)]
    with pytest.raises(ValueError, match="multiple"):
        gpu_prefill_bench.parse_heads("6/4/64")
    with pytest.raises(ValueError, match="NH/NKV/D"):
        gpu_prefill_bench.parse_heads("big")


def test_nbits_bench_nodes_are_valid_matmul_nbits():
    from onnxep.providers.ops.op_matmul_nbits import matmul_nbits

    shapes = dict((p, (k, n)) for p, k, n in gpu_nbits_prefill_bench.projections("0.5b"))
    assert shapes["qkv"] == (896, 1152) and shapes["lm_head"] == (896, 151936)
    node = gpu_nbits_prefill_bench.nbits_node(96, 10, np.dtype(np.float32), 4,
                                              np.random.default_rng(0))  # fmt: skip
    a = np.ones((3, 96), np.float32)
    (y,) = matmul_nbits(node, np)(a, *[v.const for v in node.inputs[1:]])
    assert y.shape == (3, 10) and np.isfinite(y).all()


@pytest.mark.skipif(bool(available()), reason=f"cannot emulate CUDA: {available()}")
def test_attention_bench_builders_agree_on_the_emulator(monkeypatch):
    """The tensor-core step and the tiled step of the bench give the same attention."""
    from onnxep.providers_cuda import nvrtc
    from onnxep.providers_cuda.ops import _flash_prefill

    emulator = Emulator()
    monkeypatch.setattr(nvrtc, "function", emulator.function)
    monkeypatch.setattr(_flash_prefill, "device_facts", lambda: (90, 227 * 1024))
    xp = types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("_")})
    xp.empty = nan_empty
    dt = np.dtype(np.float16)

    def rand_for(seed):
        rng = np.random.default_rng(seed)
        return lambda shape: rng.standard_normal(shape).astype(dt)

    shape = (dt, 1, 4, 2, 64, 70, True)
    kernels = _flash_prefill.Kernels("bench")
    flash_step, route = gpu_prefill_bench.build_step(xp, *shape, kernels, rand_for(1), 8)
    tiled_step, none = gpu_prefill_bench.build_step(xp, *shape, None, rand_for(1), 8)
    assert route.flash and none is None
    got, want = flash_step(), tiled_step()
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), atol=3e-3, rtol=2e-3)
    y = gpu_prefill_bench.build_flash(xp, kernels, *shape, rand_for(2))()
    assert y.shape == (1, 70, 4 * 64) and np.isfinite(y.astype(np.float32)).all()
