"""Where an fp16 hybrid decoder's decode parts from its fp32 reference, per step and per layer.

    python bench/hybrid_divergence.py --size qwen3.5-0.8b --providers cpu --providers cuda,cpu

Builds the factory's hybrid (Qwen3.5-shaped) decoder of ``--size`` in fp32 and fp16
from one seed (the same weights: fp16 is the fp32 draw rounded), decodes greedily on
the CPU provider with the fp32 export (the reference: prompt + ``--tokens`` tokens),
then runs every side on that token stream, teacher-forced (each step fed the
reference's token, as ``onnxep.generate`` runs it otherwise: IO binding, shared
device KV buffers, states updated in place, CUDA graphs). Sides: each
``--providers`` (on the fp16 export unless ``:fp32``/``:fp32w16`` follows), and the
noise floors ``--floors``: onnxruntime's CPU provider on the fp16 export (an
independent fp16 implementation) and the CPU provider on ``fp32w16`` (fp16 weights,
fp32 arithmetic: what rounding the weights alone does).

Prints, per step: the reference's top-1 token and margin (top-1 minus top-2 logit),
and per side the max |logit - reference| and whether its top-1 agrees; then per side
a summary: steps agreeing, steps agreeing where the margin exceeds twice the floors'
logit difference (a flip there is more than fp16 rounding explains), and the first
step it parts (a free greedy decode agrees that long). Then, at ``--probe-step``, the
residual stream and each sublayer's output per layer (``--probe ops``: every op's
output) against the reference, twice: "carried" (each side's own states, as its decode
left them) and "fresh" (every side fed the reference's states, rounded to its types:
one step's arithmetic alone). ``--json`` writes every number.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ is imported from the root

from bench.divergence import (  # noqa: E402
    Side,
    Trace,
    compare,
    margin,
    probe_model,
    round_weights_like,
    run_probe,
    teacher_forced,
)
from bench.factory import HYBRID_SIZES, build_hybrid_decoder  # noqa: E402

REFERENCE = Side(("cpu",), "fp32")
DEFAULT_FLOORS = ("ort:fp16", "cpu:fp32w16")
_LAYER = re.compile(r"^/model/layers\.(\d+)/")
#: producers whose outputs --probe ops leaves out (pure data movement)
_MOVES = {"Constant", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Shape", "Identity"}
#: the sublayer outputs --probe layers shows besides the norms
_SUBLAYER_OUT = ("/linear_attn/out_proj/MatMul", "/attn/o_proj/MatMul", "/mlp/down_proj/MatMul")


def config(size: str, overrides: list[str]) -> Any:
    cfg = HYBRID_SIZES[size]
    changes: dict[str, Any] = {}
    for item in overrides:
        key, _, value = item.partition("=")
        if key not in {f.name for f in dataclasses.fields(cfg)}:
            raise SystemExit(f"--set {item}: {key!r} is not a HybridConfig field")
        changes[key] = type(getattr(cfg, key))(float(value) if "." in value else int(value))
    if "layers" in changes:
        changes.setdefault("layer_types", ())  # recomputed from full_attention_interval
    return cfg.replace(**changes) if changes else cfg


def build(cfg: Any, seed: int, positions: str, folder: Path, variants: set[str]) -> dict:
    """The exports ``variants`` need, reused when the folder already holds them."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp = folder / "factory.json"
    want = {"config": repr(cfg), "seed": seed, "positions": positions}
    if stamp.is_file() and json.loads(stamp.read_text()) != want:
        raise SystemExit(f"{folder} holds other models ({stamp}); give another --models folder")
    stamp.write_text(json.dumps(want))
    paths = {v: folder / v / "model.onnx" for v in ("fp32", "fp16", "fp32w16")}
    need = set(variants) | {"fp32"}
    if "fp32w16" in need:
        need.add("fp16")
    todo = [v for v in ("fp32", "fp16") if v in need and not paths[v].is_file()]
    t0 = time.perf_counter()
    # two processes: drawing the weights is single-threaded NumPy, a minute each at 0.8B
    with ProcessPoolExecutor(max_workers=max(len(todo), 1)) as pool:
        jobs = [pool.submit(_build_one, cfg, seed, v, paths[v], positions) for v in todo]
        for v, job in zip(todo, jobs):
            job.result()
            print(f"built {paths[v]} in {time.perf_counter() - t0:.1f} s", flush=True)
    if "fp32w16" in need and not paths["fp32w16"].is_file():
        round_weights_like(paths["fp32"], paths["fp16"], paths["fp32w16"])
        print(f"built {paths['fp32w16']} (fp32 export, fp16-rounded weights)", flush=True)
    return paths


def _build_one(cfg: Any, seed: int, dtype: str, path: Path, positions: str) -> None:
    build_hybrid_decoder(cfg, seed=seed, dtype=dtype, out_path=path, positions=positions)


def probe_names(path: Path, level: str) -> list[tuple[str, str, str]]:
    """(value, layer, what) for the values ``level`` shows, in graph order."""
    model = onnx.load(str(path), load_external_data=False)
    out = []
    for n in model.graph.node:
        m = _LAYER.match(n.name)
        layer = m.group(1) if m else ("final" if "final_norm" in n.name else "-")
        what = n.name[m.end() :] if m else n.name.lstrip("/")
        if level == "layers":
            if n.op_type in ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"):
                norm = (
                    what.rsplit("/", 1)[0].removesuffix("/LayerNorm").removesuffix("/SkipLayerNorm")
                )
                out.append((n.output[0], layer, f"{norm} (normed)"))
                if len(n.output) > 3 and n.output[3]:
                    out.append((n.output[3], layer, f"{norm} (residual in)"))
            elif any(n.name.endswith(s) for s in _SUBLAYER_OUT):
                out.append((n.output[0], layer, what.split("/")[0] + " out"))
        elif n.op_type not in _MOVES and not n.name.startswith("/model/attn_mask"):
            for j, o in enumerate(n.output):
                if o and o != "logits" and not o.startswith("present"):
                    out.append((o, layer, f"{what}:{j}"))
    out.append(("logits", "final", "logits"))
    return out


def step_table(ref: Trace, traces: list[Trace], floors: list[Trace]) -> list[dict]:
    rows = []
    for t, ref_logits in enumerate(ref.logits):
        row: dict[str, Any] = {"step": t, "ref_token": ref.top1[t], "margin": margin(ref_logits)}
        for tr in traces:
            row[tr.side.label] = {
                "max_abs": float(np.max(np.abs(tr.logits[t] - ref_logits))),
                "top1": tr.top1[t],
                "agree": tr.top1[t] == ref.top1[t],
            }
        row["floor"] = max((row[f.side.label]["max_abs"] for f in floors), default=0.0)
        rows.append(row)
    return rows


def summaries(rows: list[dict], traces: list[Trace]) -> dict[str, dict]:
    out = {}
    for tr in traces:
        lab = tr.side.label
        agree = [r[lab]["agree"] for r in rows]
        decided = [r for r in rows if r["margin"] > 2 * r["floor"]]
        diffs = [r[lab]["max_abs"] for r in rows]
        out[lab] = {
            "agree": int(sum(agree)),
            "steps": len(rows),
            "decided_steps": len(decided),
            "agree_decided": int(sum(r[lab]["agree"] for r in decided)),
            "first_parting": next((i for i, a in enumerate(agree) if not a), None),
            "median_max_abs": float(np.median(diffs)),
            "max_max_abs": float(np.max(diffs)),
            "state_path": tr.state_path,
        }
    return out


def print_steps(rows: list[dict], traces: list[Trace]) -> None:
    labels = [t.side.label for t in traces]
    head = f"{'step':>4} {'token':>7} {'margin':>8} {'floor':>8} | " + " | ".join(
        f"{lab[:18]:>18} ok" for lab in labels
    )
    print(head)
    for r in rows:
        cells = " | ".join(
            f"{r[lab]['max_abs']:>18.4g} {'y' if r[lab]['agree'] else 'N'} " for lab in labels
        )
        print(
            f"{r['step']:>4} {r['ref_token']:>7} {r['margin']:>8.4g} {r['floor']:>8.4g} | {cells}"
        )


def print_summary(summ: dict[str, dict]) -> None:
    print(
        "\nside                    agree  agree where margin > 2*floor  parts at  median/max dlogit"
    )
    for lab, s in summ.items():
        print(
            f"{lab:<22} {s['agree']:>3}/{s['steps']:<3} "
            f"{s['agree_decided']:>14}/{s['decided_steps']:<14} {str(s['first_parting']):>8}  "
            f"{s['median_max_abs']:.4g}/{s['max_max_abs']:.4g}"
        )
        print(f"{'':<22} state: {s['state_path']}")


def probes(args, paths, ref: Trace, traces: list[Trace]) -> list[dict]:
    names = probe_names(paths["fp32"], args.probe)
    values = [n for n, _, _ in names]
    probe_paths = {}
    for v in {tr.side.variant for tr in traces} | {"fp32"}:
        probe_paths[v] = probe_model(
            paths[v], values, paths[v].with_name(f"probe-{args.probe}.onnx")
        )
    (ref_vals,), ref_fusions = run_probe(REFERENCE, probe_paths["fp32"], values, [ref.probe_feeds])
    if ref_fusions != ref.fusions:
        print(f"note: probing changed the reference's fusions: {ref.fusions} -> {ref_fusions}")
    results = {}
    for tr in traces:
        (carried, fresh), fus = run_probe(
            tr.side, probe_paths[tr.side.variant], values, [tr.probe_feeds, ref.probe_feeds]
        )
        if not tr.side.is_ort and fus != tr.fusions:
            print(f"note: probing changed {tr.side.label}'s fusions: {tr.fusions} -> {fus}")
        # the probed run must be the decode's own step: its logits, unprobed
        drift = float(np.max(np.abs(carried["logits"][0, -1] - tr.logits[args.probe_step])))
        if drift:
            print(f"note: {tr.side.label}'s probed logits differ from its decode's by {drift:.3g}")
        results[tr.side.label] = (carried, fresh)
    rows = []
    for name, layer, what in names:
        row: dict[str, Any] = {"value": name, "layer": layer, "what": what}
        for lab, (carried, fresh) in results.items():
            row[lab] = {
                "carried": compare(carried[name], ref_vals[name]),
                "fresh": compare(fresh[name], ref_vals[name]),
            }
        rows.append(row)
    return rows


def print_probes(rows: list[dict], labels: list[str], step: int) -> None:
    print(f"\nstep {step}: RMS relative error vs the reference, carried / fresh states")
    print(f"{'layer':>5} {'value':<44} | " + " | ".join(f"{lab[:21]:>21}" for lab in labels))
    for r in rows:
        cells = " | ".join(
            f"{r[lab]['carried']['rms_rel']:>10.3g}/{r[lab]['fresh']['rms_rel']:<10.3g}"
            for lab in labels
        )
        print(f"{r['layer']:>5} {r['what'][:44]:<44} | {cells}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="qwen3.5-0.8b", choices=sorted(HYBRID_SIZES))
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=N",
        help="override a HybridConfig field (layers=8, vocab=32000)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--positions",
        choices=("2d", "3d"),
        default="3d",
        help="rotary position ids: 3d is the builder's MRotaryEmbedding",
    )
    p.add_argument("--prompt", type=int, default=8, help="prompt tokens")
    p.add_argument("--tokens", type=int, default=48, help="decode steps (the prefill included)")
    p.add_argument(
        "--providers",
        action="append",
        default=[],
        metavar="LIST[:EXPORT]",
        help="a side: onnxep providers or ort, then :fp16 (default), :fp32 or :fp32w16",
    )
    p.add_argument(
        "--floor",
        action="append",
        default=[],
        metavar="SIDE",
        help="a noise-floor side (default: ort:fp16 and cpu:fp32w16; none: no floor)",
    )
    p.add_argument("--probe", choices=("layers", "ops", "none"), default="layers")
    p.add_argument("--probe-step", type=int, default=4)
    p.add_argument("--models", type=Path, default=Path("/tmp/onnxep-hybrid-divergence"))
    p.add_argument("--json", type=Path, help="write every number here")
    args = p.parse_args(argv)

    cfg = config(args.size, args.set)
    sides = [Side.parse(s) for s in (args.providers or ["cpu"])]
    floors = [Side.parse(s) for s in (args.floor or DEFAULT_FLOORS) if s != "none"]
    if not 0 <= args.probe_step < args.tokens:
        p.error(f"--probe-step must be in [0, {args.tokens})")
    tag = "-".join([args.size, *args.set, f"s{args.seed}", args.positions])
    paths = build(
        cfg, args.seed, args.positions, args.models / tag, {s.variant for s in sides + floors}
    )
    prompt = np.random.default_rng(args.seed).integers(1, cfg.vocab, (1, args.prompt))
    probe_step = None if args.probe == "none" else args.probe_step

    t0 = time.perf_counter()
    ref = teacher_forced(REFERENCE, paths["fp32"], prompt, args.tokens, None, probe_step)
    print(
        f"reference {REFERENCE.label}: {args.tokens} tokens in {time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    traces = []
    for side in sides + floors:
        t0 = time.perf_counter()
        traces.append(
            teacher_forced(side, paths[side.variant], prompt, args.tokens, ref.top1, probe_step)
        )
        print(f"{side.label}: {time.perf_counter() - t0:.1f} s", flush=True)
    floor_traces = [t for t in traces if t.side in floors]
    rows = step_table(ref, traces, floor_traces)
    summ = summaries(rows, traces)
    print(
        f"\n{args.size} {' '.join(args.set)} seed {args.seed}, {args.positions} positions, "
        f"prompt {prompt.tolist()[0]}"
    )
    print_steps(rows, traces)
    print_summary(summ)
    probe_rows: list[dict] = []
    if probe_step is not None:
        probe_rows = probes(args, paths, ref, traces)
        print_probes(probe_rows, [t.side.label for t in traces], args.probe_step)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "size": args.size,
                    "set": args.set,
                    "seed": args.seed,
                    "positions": args.positions,
                    "prompt": prompt.tolist()[0],
                    "reference": REFERENCE.label,
                    "steps": rows,
                    "summary": summ,
                    "probe_step": probe_step,
                    "probes": probe_rows,
                    "fusions": {t.side.label: t.fusions for t in [ref, *traces]},
                },
                indent=1,
            )
        )
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
