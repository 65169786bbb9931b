"""The fp16 hybrid decoder on the CPU provider stays within fp16 rounding of its fp32 twin.

Issue 16, section 5: greedy decodes of the factory's Qwen3.5-shaped hybrid in fp16
part from each other after a few tokens. Random weights make the logits nearly
flat, so a near-tie flips under any rounding; the honest check is teacher-forced
(every side fed the fp32 reference's tokens, bench/divergence.py): per step, the
fp16 CPU logits' distance from the fp32 reference is bounded by that of
onnxruntime's CPU provider on the same fp16 export (an independent fp16 run, and a
lenient one: it keeps about half its intermediates in float32 through the casts
it inserts), and the top-1 token agrees wherever the reference's margin exceeds
twice that distance. The size is the smallest found where fp16 greedy decoding
parts from fp32 (Qwen3.5-0.8B's vocabulary, 8 layers of width 256): the
difference shows here, and it is fp16 rounding. Per layer, at one step, the
residual stream keeps within the same bound.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.divergence import (  # noqa: E402
    Side,
    compare,
    margin,
    probe_model,
    run_probe,
    teacher_forced,
)
from bench.factory import HYBRID_SIZES, build_hybrid_decoder  # noqa: E402

pytest.importorskip("onnxruntime")

#: Qwen3.5-0.8B's vocabulary and head layout (3 linear-attention layers to 1 full), narrower
CONFIG = HYBRID_SIZES["qwen3.5-0.8b"].replace(
    hidden=256, layers=8, heads=4, kv_heads=2, head_dim=64, intermediate=512, max_length=256,
    linear_key_heads=4, linear_value_heads=4, linear_key_dim=64, linear_value_dim=64,
    layer_types=(), mrope_section=(),
)  # fmt: skip
SEED, STEPS, PROBE_STEP = 3, 24, 6
#: How much farther from fp32 the fp16 CPU logits may be than onnxruntime's partly-fp32
#: run: at any step, and in the median over steps. Seen here: 1.80 and 1.12 (at 0.8B, 1.4
#: and 1.08). MatMuls summing in float16 (float32 partial sums of 64 products added up in
#: float16) give 2.33 and 1.43; of 16, 2.42 and 1.66; of 4, 3.74 and 2.78.
RATIO, MEDIAN_RATIO = 2.5, 1.3

REF, CPU16, ORT16 = Side(("cpu",), "fp32"), Side(("cpu",), "fp16"), Side(("ort",), "fp16")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hybrid_divergence")
    paths = {}
    for dt in ("fp32", "fp16"):
        paths[dt] = folder / dt / "model.onnx"
        build_hybrid_decoder(CONFIG, seed=SEED, dtype=dt, out_path=paths[dt], positions="3d")
    prompt = np.random.default_rng(SEED).integers(1, CONFIG.vocab, (1, 8))
    ref = teacher_forced(REF, paths["fp32"], prompt, STEPS, None, PROBE_STEP)
    sides = {
        s: teacher_forced(s, paths[s.variant], prompt, STEPS, ref.top1, PROBE_STEP)
        for s in (CPU16, ORT16)
    }
    return paths, ref, sides


def test_fp16_logits_stay_within_the_rounding_bound_and_agree_where_decided(runs):
    _, ref, sides = runs
    cpu, ort = sides[CPU16], sides[ORT16]
    parted, decided, ratios = [], 0, []
    for t in range(STEPS):
        d_cpu = float(np.max(np.abs(cpu.logits[t] - ref.logits[t])))
        d_ort = float(np.max(np.abs(ort.logits[t] - ref.logits[t])))
        ratios.append(d_cpu / d_ort)
        assert d_cpu <= RATIO * d_ort, (
            f"step {t}: fp16 CPU logits are {d_cpu:.4g} from fp32, onnxruntime's fp16 "
            f"{d_ort:.4g}: more than fp16 rounding explains"
        )
        bound = 2 * max(d_cpu, d_ort)
        if margin(ref.logits[t]) > bound:
            decided += 1
            assert cpu.top1[t] == ref.top1[t], f"step {t}: top-1 flipped at margin > {bound:.4g}"
        if cpu.top1[t] != ref.top1[t]:
            parted.append(t)
    assert np.median(ratios) <= MEDIAN_RATIO, f"median ratio {np.median(ratios):.3g} to onnxruntime"
    assert decided >= STEPS // 2
    # the setup still shows the difference: fp16 greedy parts from fp32 at a near-tie
    assert parted, "no step flipped: this size no longer shows the difference; pick another"


def test_fp16_residual_stream_per_layer_stays_within_the_bound(runs, tmp_path):
    paths, ref, sides = runs
    names = []
    import onnx

    for n in onnx.load(str(paths["fp32"]), load_external_data=False).graph.node:
        if n.op_type == "SkipSimplifiedLayerNormalization" and len(n.output) > 3:
            names.append(n.output[3])  # the residual stream entering each sublayer
    assert len(names) == 2 * CONFIG.layers - 1
    probes = {
        v: probe_model(paths[v], names, paths[v].with_name("probe.onnx")) for v in paths
    }  # fmt: skip
    (want,), _ = run_probe(REF, probes["fp32"], names, [ref.probe_feeds])
    got = {}
    for side in (CPU16, ORT16):
        (got[side],), _ = run_probe(side, probes["fp16"], names, [sides[side].probe_feeds])
    for name in names:
        e_cpu = compare(got[CPU16][name], want[name])["rms_rel"]
        e_ort = compare(got[ORT16][name], want[name])["rms_rel"]
        assert 0 < e_cpu <= RATIO * e_ort, (
            f"{name}: RMS error {e_cpu:.3g} vs onnxruntime {e_ort:.3g}"
        )
        assert e_cpu < 0.05, f"{name}: fp16 residual stream {e_cpu:.3g} from fp32"


def test_the_bench_script_reports_steps_summary_and_layers(tmp_path, capsys):
    import json

    from bench.hybrid_divergence import main

    out = tmp_path / "out.json"
    args = ["--size", "tiny", "--tokens", "4", "--probe-step", "2", "--models", str(tmp_path)]
    assert main([*args, "--providers", "cpu", "--providers", "cpu:fp32", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "agree where margin > 2*floor" in printed and "residual in" in printed
    assert "note:" not in printed  # probing changed no fusion and no logit
    got = json.loads(out.read_text())
    assert [s["step"] for s in got["steps"]] == [0, 1, 2, 3]
    # the same export on the same provider, teacher-forced, is the reference exactly
    assert all(s["cpu:fp32"]["max_abs"] == 0 for s in got["steps"])
    assert all(r["cpu:fp32"]["carried"]["max_abs"] == 0 for r in got["probes"])
    assert set(got["summary"]) == {"cpu:fp16", "cpu:fp32", "ort:fp16", "cpu:fp32w16"}
    assert all(0 < s["cpu:fp16"]["max_abs"] < 0.05 for s in got["steps"])
