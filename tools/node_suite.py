"""Developer tool: run ONNX backend cases through onnxep and list failures.

python tools/node_suite.py [--ops Add,Relu] [--pattern REGEX] [--category node] [-q]
"""

from __future__ import annotations

import argparse
import collections

from onnxep.tools.conformance import run_suite


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="")
    ap.add_argument("--pattern", default=None)
    ap.add_argument("--category", default="node")
    ap.add_argument("--providers", default="cpu")
    ap.add_argument("-q", action="store_true", help="only the summary")
    a = ap.parse_args()
    ops = [o for o in a.ops.split(",") if o] or None
    res = run_suite(a.providers.split(","), a.category.split(","), a.pattern, ops)
    bad = [r for r in res if not r.ok]
    if not a.q:
        for r in bad:
            print(f"FAIL {r.name}: {r.reason}")
    per_op = collections.Counter(op for r in bad for op in r.ops)
    print(f"{len(res) - len(bad)} passed, {len(bad)} failed")
    if a.q and per_op:
        print("failing ops:", ", ".join(f"{k}:{v}" for k, v in per_op.most_common()))


if __name__ == "__main__":
    main()
