"""The ONNX backend node suite on the CUDA provider (run on a GPU machine).

    python bench/gpu_conformance.py OUT_DIR [--pattern RX] [--cpu] [--budget SECONDS]

1. ``providers=["cuda"]`` with ``disable_fallback=True``: a case *passes*
   when every compute node runs on CUDA (host shape math allowed) and the
   outputs match the recorded ones; it is *declined* when the session
   refuses to build (the reasons are collected), and *fails* otherwise.
2. ``providers=["cuda", "cpu"]``: cases that passed in 1 pass here too (the
   same placement); the others run again with the CPU behind CUDA.
3. With ``--cpu``, ``providers=["cpu"]`` on every case, for the same count.

Writes OUT_DIR/conformance_cuda.json and prints a short table.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np


def _run(case: Any, providers: list[str], strict: bool) -> tuple[str, str]:
    from onnx.backend.test.runner import Runner

    import onnxep
    from onnxep.errors import FallbackError, NotImplementedOp
    from onnxep.tools.conformance import case_data, case_model

    model = case_model(case)
    names = [i.name for i in model.graph.input]
    opts = onnxep.SessionOptions(disable_fallback=strict, log_severity_level=3)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            sess = onnxep.InferenceSession(model, opts, providers=providers)
        except (FallbackError, NotImplementedOp) as exc:
            return "declined", str(exc)
        except Exception as exc:
            return "failed", f"session: {type(exc).__name__}: {exc}"[:400]
        try:
            for ins, outs in case_data(case):
                got = sess.run(None, dict(zip(names, ins)))
                Runner.assert_similar_outputs(outs, got, case.rtol, case.atol, case.model_dir)
        except Exception as exc:
            msg = " | ".join(f"{type(exc).__name__}: {exc}".strip().splitlines()[:4])
            return "failed", msg[:400]
    return "passed", ""


def _reasons(message: str) -> list[str]:
    """The per-node decline reasons in a FallbackError message, without node names."""
    out = []
    for line in message.splitlines():
        m = re.search(r"\(cuda: (.*)\)\s*$", line)
        if m:
            out.append(m.group(1).split("; cpu:")[0])
    return out or [message.splitlines()[0][:200]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--pattern", default=None)
    ap.add_argument("--cpu", action="store_true", help="also count the CPU provider alone")
    ap.add_argument("--budget", type=float, default=1e9, help="stop after this many seconds")
    a = ap.parse_args()

    from onnxep.tools.conformance import load_cases, select_cases

    t0 = time.time()
    cases = select_cases(load_cases("node"), a.pattern)
    loaded = time.time() - t0
    strict: dict[str, tuple[str, str]] = {}
    mixed: dict[str, tuple[str, str]] = {}
    cpu: dict[str, tuple[str, str]] = {}
    stopped = False
    for case in cases:
        if time.time() - t0 > a.budget:
            stopped = True
            break
        strict[case.name] = _run(case, ["cuda"], strict=True)
        if strict[case.name][0] == "passed":
            mixed[case.name] = strict[case.name]
        elif strict[case.name][0] == "failed":
            mixed[case.name] = ("failed", "same placement as the cuda-only run")
        else:
            mixed[case.name] = _run(case, ["cuda", "cpu"], strict=False)
        if a.cpu:
            cpu[case.name] = _run(case, ["cpu"], strict=False)

    def count(d: dict, status: str) -> int:
        return sum(1 for s, _ in d.values() if s == status)

    declines: collections.Counter = collections.Counter()
    for s, msg in strict.values():
        if s == "declined":
            declines.update(set(_reasons(msg)))
    import cupy

    doc = {
        "date": time.strftime("%Y-%m-%d"),
        "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "cupy": cupy.__version__,
        "onnx": __import__("onnx").__version__,
        "cases": len(cases),
        "ran": len(strict),
        "stopped_by_budget": stopped,
        "seconds": time.time() - t0,
        "load_seconds": loaded,
        "cuda_only_disable_fallback": {
            "passed": count(strict, "passed"),
            "failed": count(strict, "failed"),
            "declined": count(strict, "declined"),
        },
        "cuda_then_cpu": {"passed": count(mixed, "passed"), "failed": count(mixed, "failed")},
        "cpu_alone": {"passed": count(cpu, "passed"), "failed": count(cpu, "failed")}
        if a.cpu
        else None,
        "passed_on_cpu_not_on_cuda_cpu": sorted(
            n for n in cpu if cpu[n][0] == "passed" and mixed.get(n, ("",))[0] != "passed"
        ),
        "failures_cuda_only": {n: m for n, (s, m) in strict.items() if s == "failed"},
        "failures_cuda_then_cpu": {n: m for n, (s, m) in mixed.items() if s == "failed"},
        "decline_reasons": dict(declines.most_common()),
        "declined_cases": sorted(n for n, (s, _) in strict.items() if s == "declined"),
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "conformance_cuda.json").write_text(json.dumps(doc, indent=1))
    c = doc["cuda_only_disable_fallback"]
    print(f"node cases: {doc['ran']} of {doc['cases']} in {doc['seconds']:.0f} s")
    print(
        f"cuda only (disable_fallback): passed {c['passed']}, failed {c['failed']}, "
        f"declined {c['declined']}"
    )
    print(f"cuda, cpu: passed {doc['cuda_then_cpu']['passed']}")
    if a.cpu:
        print(f"cpu alone: passed {doc['cpu_alone']['passed']}")
    for n, m in list(doc["failures_cuda_only"].items())[:15]:
        print(f"  FAIL {n}: {m[:160]}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
