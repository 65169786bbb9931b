"""Cold start beside onnxruntime: ``import``, then a first session and run, each in a fresh process.

    python bench/cold_start.py [--model tests/data/resnet_cnn.onnx] [--repeat 5] [--importtime]

What a user feels on every command: each figure is the median of ``--repeat``
fresh interpreters (nothing cached in the process), for onnxep and for
onnxruntime in the same run. ``import`` is the package's import; ``session``
is creating the first ``InferenceSession`` of the model after that import;
``first run`` its first ``run`` on random inputs. ``--importtime`` prints the
modules ``python -X importtime -c "import onnxep"`` spends most on, and which
of onnxep's tooling modules (there should be none) that import loaded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "tests" / "data" / "resnet_cnn.onnx"

#: one fresh process: import, create a session, run once; the three times as JSON
PROBE = """
import json, sys, time
t0 = time.perf_counter()
import {module} as rt
t1 = time.perf_counter()
import numpy as np
sess = rt.InferenceSession(sys.argv[1]{providers})
t2 = time.perf_counter()
feeds = {{}}
for a in sess.get_inputs():
    shape = [d if isinstance(d, int) else 1 for d in a.shape]
    feeds[a.name] = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
t3 = time.perf_counter()
sess.run(None, feeds)
t4 = time.perf_counter()
print(json.dumps({{"import": t1 - t0, "session": t2 - t1, "first run": t4 - t3}}))
"""

RUNTIMES = {
    "onnxep": PROBE.format(module="onnxep", providers=', providers=["cpu"]'),
    "onnxruntime": PROBE.format(
        module="onnxruntime", providers=', providers=["CPUExecutionProvider"]'
    ),
}

#: onnxep's tooling, which ``import onnxep`` must not load
TOOLING = ("onnxep.tools", "onnxep.benchmark")


def probe(code: str, model: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", code, str(model)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(model: Path, repeat: int) -> dict[str, dict[str, float]]:
    """Median seconds per runtime and phase; the runtimes' processes alternate."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in RUNTIMES}
    for _ in range(repeat):
        for name, code in RUNTIMES.items():
            runs[name].append(probe(code, model))
    return {
        name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()
    }


def import_profile(top: int = 12) -> tuple[list[tuple[int, str]], list[str]]:
    """The ``top`` modules by cumulative import time (us), and the tooling modules loaded."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import onnxep"],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = []
    for line in out.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = (p.strip() for p in line[len("import time:") :].split("|"))
        rows.append((int(cumulative), name))
    loaded = sorted({n.strip() for _, n in rows if n.strip().startswith(TOOLING)})
    return sorted(rows, reverse=True)[:top], loaded


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=MODEL)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--importtime", action="store_true")
    ap.add_argument("--json", action="store_true", help="print the medians as JSON")
    args = ap.parse_args(argv)
    result = measure(args.model, args.repeat)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.model.name}, median of {args.repeat} fresh processes (ms)")
        print(f"{'':<12} {'import':>8} {'session':>8} {'first run':>10} {'total':>8}")
        for name, t in result.items():
            total = sum(t.values())
            row = " ".join(f"{1e3 * t[k]:>8.0f}" for k in ("import", "session"))
            print(f"{name:<12} {row} {1e3 * t['first run']:>10.1f} {1e3 * total:>8.0f}")
    if args.importtime:
        rows, loaded = import_profile()
        print("\nimport onnxep, cumulative import time by module (ms):")
        for us, name in rows:
            print(f"  {us / 1e3:>8.1f}  {name.strip()}")
        print(f"tooling modules loaded by import onnxep: {loaded or 'none'}")


if __name__ == "__main__":
    main()
