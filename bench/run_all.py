"""Run the standard benchmark set on this machine and record it.

    python bench/run_all.py [--quick] [--only NAME ...]

Writes bench/results/<date>-<machine>.json (every sample) and .md (the table),
then rebuilds docs/benchmarks.md from every results file, latest per machine.
Each entry runs onnxep and its peers interleaved on identical inputs
(`onnxep.benchmark.bench`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from onnxep.benchmark import bench  # noqa: E402

DATA = ROOT / "tests" / "data"
RESULTS = ROOT / "bench" / "results"

# name -> (model, kwargs); CPU-only set, the peers every one of them can run.
STANDARD = {
    "llama_kv 8 new over 16 past": (
        DATA / "llama_kv.onnx",
        dict(vs=["onnxruntime", "reference"], dims={"batch": 1, "seq": 8, "past": 16}),
    ),
    "resnet_cnn 1x3x64x64": (
        DATA / "resnet_cnn.onnx",
        dict(vs=["onnxruntime", "reference"], dims={"batch": 1}),
    ),
    "genai qwen2 tiny fp32, decode 1 token": (
        DATA / "genai" / "qwen2_fp32" / "model.onnx",
        dict(vs=["onnxruntime"], decode=32, context=16),
    ),
    "genai qwen2 tiny int4, decode 1 token": (
        DATA / "genai" / "qwen2_int4" / "model.onnx",
        dict(vs=["onnxruntime"], decode=32, context=16),
    ),
    "hf_llama prefill 7 tokens": (
        DATA / "hf_llama.onnx",
        dict(vs=["onnxruntime", "reference"], dims={"batch": 1, "seq": 7}),
    ),
}


def machine_name() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return re.sub(r"[^A-Za-z0-9]+", "-", cpu).strip("-").lower()[:48]


def commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"


def to_markdown(doc: dict) -> str:
    m = doc["machine"]
    lines = [
        f"### {doc['machine_name']} ({doc['date']}, commit {doc['commit']})",
        "",
        f"CPU: {m.get('cpu')}, {m.get('cores')} cores; numpy {m.get('numpy')}, "
        f"onnxruntime {m.get('onnxruntime')}, onnx {m.get('onnx')}"
        + (f"; GPU {m['gpu']}" if m.get("gpu") else ""),
        "",
        "| benchmark | side | median ms | p90 ms | tok/s | peer / onnxep |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for name, r in doc["results"].items():
        for side, s in r["summary"].items():
            tok = f"{1000.0 / s['median_ms']:.1f}" if r["mode"] == "decode" else ""
            ratio = r["ratios_vs_onnxep"][side]
            lines.append(
                f"| {name} | {side} | {s['median_ms']:.3f} | {s['p90_ms']:.3f} | {tok} | "
                f"{ratio:.2f}x |"
            )
        for side, why in r.get("skipped", {}).items():
            lines.append(f"| {name} | {side} | skipped: {why} | | | |")
    if "overhead_us_per_node" in doc:
        o = doc["overhead_us_per_node"]
        lines += [
            "",
            f"Executor host overhead per node (`bench/overhead.py`, a chain of 500 tiny Adds): "
            f"onnxep {o['onnxep']:.3f} us, onnxruntime {o['onnxruntime']:.3f} us.",
        ]
    lines += [
        "",
        "Ratios are the peer's median over onnxep's: above 1 means onnxep is faster.",
        "",
    ]
    return "\n".join(lines)


def rebuild_docs() -> None:
    latest: dict[str, dict] = {}
    for f in sorted(RESULTS.glob("*.json")):
        doc = json.loads(f.read_text())
        latest[doc["machine_name"]] = doc
    out = [
        "# Benchmarks",
        "",
        "Produced by `python bench/run_all.py` (latest run per machine; every sample is in",
        "`bench/results/*.json`). Each benchmark runs onnxep and its peers interleaved",
        "(A B A B ...) on identical inputs after warm-up; decode figures are per decode step",
        "after a prefill, greedy, with the KV cache fed back.",
        "",
    ]
    for doc in latest.values():
        out.append(to_markdown(doc))
    (ROOT / "docs" / "benchmarks.md").write_text("\n".join(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="few runs, to check the harness")
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--runs", type=int, default=100)
    a = ap.parse_args()
    runs = 5 if a.quick else a.runs
    results = {}
    for name, (model, kw) in STANDARD.items():
        if a.only and not any(o in name for o in a.only):
            continue
        kw = dict(kw)
        if kw.get("decode"):
            kw["decode"] = 4 if a.quick else kw["decode"]
        r = bench(str(model), runs=runs, warmup=3 if a.quick else 10, progress=False, **kw)
        print(r.table(), "\n")
        results[name] = r.to_json()
    from bench.overhead import measure

    overhead = measure(500, 50 if a.quick else 300)
    print(f"host overhead per node (chain of 500 Adds): {overhead}")
    today = dt.date.today().isoformat()
    any_result = next(iter(results.values()))
    doc = {
        "date": today,
        "machine_name": machine_name(),
        "machine": any_result["machine"],
        "commit": commit(),
        "results": results,
        "overhead_us_per_node": overhead,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"{today}-{doc['machine_name']}"
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=str))
    stem.with_suffix(".md").write_text(to_markdown(doc))
    rebuild_docs()
    print(f"wrote {stem}.json, {stem}.md and docs/benchmarks.md")


if __name__ == "__main__":
    main()
