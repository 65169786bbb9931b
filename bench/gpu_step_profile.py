"""Where a decode step's device time goes: CUDA kernels by total time per step (GPU machine).

    python bench/gpu_step_profile.py MODEL [--steps N] [--top K] [--capture off|auto]

Decodes greedily on ``["cuda", "cpu"]`` (eager by default: inside a replayed CUDA graph
CUPTI sees no kernel names) and prints one JSON line per kernel name, heaviest first:
launches and microseconds per step, from CUPTI through ``torch.profiler``, then a total
line with the step's summed kernel time against its wall time.
"""

from __future__ import annotations

import argparse
import collections
import json

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--capture", default="off")
    args = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    import onnxep
    from onnxep.generation.greedy import GreedyDecoder

    sess = onnxep.InferenceSession(
        args.model, providers=[("cuda", {"capture": args.capture}), "cpu"]
    )
    prompt = np.random.default_rng(0).integers(1, 100, 8)
    # not pipelined: each step's run is queued inside its own step, so the profiled steps
    # launch exactly their own kernels
    dec = GreedyDecoder(sess, prompt, 4 + args.steps, capacity=8 + 4 + args.steps, pipeline=False)
    for _ in range(4):  # prefill and warm-up
        dec.step()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.steps):
            dec.step()
        torch.cuda.synchronize()
    per: dict[str, list[float]] = collections.defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name].append(float(e.time_range.elapsed_us()))
    rows = sorted(per.items(), key=lambda kv: -sum(kv[1]))
    total = sum(sum(v) for v in per.values()) / args.steps
    for name, times in rows[: args.top]:
        print(
            json.dumps(
                {
                    "kernel": name[:90],
                    "launches_per_step": round(len(times) / args.steps, 2),
                    "us_per_step": round(sum(times) / args.steps, 1),
                    "share": round(sum(times) / args.steps / total, 3) if total else None,
                }
            )
        )
    r = dec.finish()
    print(
        json.dumps(
            {
                "total_kernel_us_per_step": round(total, 1),
                "launches_per_step": round(sum(len(v) for v in per.values()) / args.steps, 1),
                "wall_ms_per_step": round(float(np.median(r.step_ms[4:])), 3),
                "capture": args.capture,
                "model": args.model,
            }
        )
    )


if __name__ == "__main__":
    main()
