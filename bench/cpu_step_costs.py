"""Each plan step's own wall time on a decode step, without a profiler around it.

    python bench/cpu_step_costs.py MODEL [--past 16] [--repeat 300] [--top 30]

One checked run records every step's arguments; then each step's kernel is called
``--repeat`` times alone on those arguments (its own minimum of five medians-of-blocks
is the figure), so the profiler's per-event cost and the machine's noise stay out. The
sum against the session's wall time is the executor's own cost.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def main() -> None:
    from cpu_profile_decode import decode_feeds

    import onnxep

    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--past", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=300)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    feeds = decode_feeds(a.model, a.past)
    sess = onnxep.InferenceSession(a.model, providers=["cpu"])
    for _ in range(5):
        sess.run(None, feeds)
    walls = []
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        walls.append(time.perf_counter() - t0)
    plan = sess._compiled.executor.plan  # noqa: SLF001  (bench tool: the session's plan)
    names = [i.name for i in sess.get_inputs()]
    slots = plan.template.copy()
    for s, x in zip(plan.input_slots, [feeds[n] for n in names]):
        slots[s] = x
    cost = []
    for step in plan.steps:
        args = [slots[i] for i in step.inputs]
        fn = step.direct or step.fn
        res = step.fn(*args)
        for s, x in zip(step.outputs, res):
            slots[s] = x
        block = max(1, a.repeat // 10)
        meds = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(block):
                fn(*args)
            meds.append((time.perf_counter() - t0) / block)
        cost.append((min(meds) * 1e6, step))
    by_op: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for us, step in cost:
        by_op[step.op_type][0] += 1
        by_op[step.op_type][1] += us
    total = sum(us for us, _ in cost)
    wall = statistics.median(walls) * 1e6
    print(
        f"wall {wall:.0f} us, steps' own sum {total:.0f} us over {len(cost)} steps "
        f"(executor and outputs: {wall - total:.0f} us)"
    )
    for op, (n, us) in sorted(by_op.items(), key=lambda kv: -kv[1][1]):
        print(f"{op:36s} {n:4d} {us:9.1f} us  {us / n:7.2f} us each")
    for us, step in sorted(cost, key=lambda c: -c[0])[: a.top]:
        print(f"  {us:8.2f} us  {step.op_type:28s} {step.name}")


if __name__ == "__main__":
    main()
