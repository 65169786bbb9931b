"""A corpus model's kernel time by kind of node, onnxep's CPU provider against onnxruntime's.

    python bench/cpu_profile_by_kind.py MODEL [MODEL ...] [--runs 60] [--threads 1] [--top 0]

As ``cpu_profile_vs_ort.py`` (each side's own profiler, one process, the sum of each
node's median), but convolutions are split by what they are, read from their weights'
shapes on both sides: ``pw`` (1x1), ``dw`` (one input channel a group) and ``dense``, so
the pointwise, depthwise and dense gaps show apart (onnxruntime's NCHWc convs keep their
shapes in its trace). ``--top N`` also lists each side's N slowest nodes with their
shapes: onnxep's node names after its fusions do not match onnxruntime's, so match them
by shape.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


def _conv_kind(w: list | tuple | None, group: int | None = None) -> str:
    if w is None or len(w) < 3:
        return "conv"
    if tuple(w[2:]) == (1,) * (len(w) - 2):
        return "pw"
    if (group is not None and group > 1 and w[1] == 1) or (group is None and w[1] == 1):
        return "dw"
    return "dense"


def _shape(v):
    try:
        return tuple(d if isinstance(d, int) else str(d) for d in v.shape)
    except (AttributeError, TypeError):
        return None


def profile(name: str, runs: int, threads: int, top: int) -> None:
    import onnx
    from real_models import CORPUS, feeds, fetch

    from bench.cpu_profiles import node_events, ort_kernel_trace, profiled_session

    model = next(m for m in CORPUS if m.name == name)
    path = fetch(model)
    inputs = feeds(model, onnx.load(str(path), load_external_data=False))
    sess = profiled_session(path, threads)
    kind, desc = {}, {}
    for n in sess.compiled.model.graph:
        w = _shape(n.inputs[1]) if len(n.inputs) > 1 and n.inputs[1] is not None else None
        k = n.op_type
        if k in ("Conv", "FusedConv"):
            g = n.attributes.get("group")
            k = _conv_kind(w, g.value if g is not None else 1)
        kind[n.name] = k
        desc[n.name] = (n.op_type, _shape(n.inputs[0]) if n.inputs else None, w)
    ours: dict[str, list[float]] = defaultdict(list)
    for node, _, us in node_events(sess, inputs, runs):
        ours[node].append(us)

    theirs: dict[str, list[float]] = defaultdict(list)
    targs: dict[str, dict] = {}
    for e in ort_kernel_trace(path, inputs, runs, threads):
        theirs[e["name"]].append(float(e["dur"]))
        targs[e["name"]] = e["args"]

    def ort_kind(a: dict) -> str:
        op = a.get("op_name", "?")
        if op not in ("Conv", "FusedConv"):
            return op
        ins = [next(iter(x.values())) for x in a.get("input_type_shape", [])]
        return _conv_kind(ins[1] if len(ins) > 1 else None)

    by_ours: dict[str, float] = defaultdict(float)
    for n, d in ours.items():
        by_ours[kind.get(n, "?")] += statistics.median(d)
    by_theirs: dict[str, float] = defaultdict(float)
    for n, d in theirs.items():
        by_theirs[ort_kind(targs[n])] += statistics.median(d)
    print(
        f"\n== {name}, {threads or 'default'} thread(s), {runs} runs: kernels onnxep "
        f"{sum(by_ours.values()):.0f} us, onnxruntime {sum(by_theirs.values()):.0f} us"
    )
    print(f"{'kind':28s} {'onnxep us':>10s} {'ort us':>9s}")
    for k in sorted(set(by_ours) | set(by_theirs), key=lambda k: -max(by_ours[k], by_theirs[k])):
        print(f"{k:28s} {by_ours[k]:10.1f} {by_theirs[k]:9.1f}")
    if top:
        print("-- onnxep's slowest nodes")
        for n in sorted(ours, key=lambda n: -statistics.median(ours[n]))[:top]:
            print(f"{statistics.median(ours[n]):9.1f} {desc.get(n)}")
        print("-- onnxruntime's slowest nodes")
        for n in sorted(theirs, key=lambda n: -statistics.median(theirs[n]))[:top]:
            a = targs[n]
            ins = [next(iter(x.values())) for x in a.get("input_type_shape", [])][:2]
            print(f"{statistics.median(theirs[n]):9.1f} {a.get('op_name')} {ins}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--top", type=int, default=0)
    a = ap.parse_args(argv)
    for name in a.models:
        profile(name, a.runs, a.threads, a.top)


if __name__ == "__main__":
    main()
