"""Where the tensor-core decode kernel's time goes: the kernel cut short at each phase.

    python bench/gpu_decode_cut.py [--shape 0.5b] [--contexts 16,32000]

An experiment, not a product path: ``gqa_decode_tc``'s source is patched to return after
each of its phases (the lengths read, the new K/V row written, the first tile's loads
issued, Q staged, the keys streamed, the warps merged), each cut writing a value that depends
on the work before it so nothing is compiled away, and each variant is timed as
``gpu_attention_bench`` times the step (captured, L2 scrubbed, CUPTI per kernel). The
differences between consecutive cuts are each phase's share of the kernel's time.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gpu_attention_bench import copy_bandwidth, measure  # noqa: E402

#: (phase, anchor in gqa_decode_tc, the value the cut writes): the cut goes after the anchor
CUTS = (
    ("lengths", "chunk - 1) / chunk);  // splits this row uses\n", "(float)nsb"),
    ("row written", "a split this row does not use\n", "(float)nsb"),
    ("first loads", "in flight while Q is staged\n", "(float)(k0[0][0] ^ v0[0][0])"),
    ("q staged", "  __syncthreads();  // Q staged\n", "to_f(qh[threadIdx.x])"),
    ("streamed", "  tc_stream<T, D, ROWS>(st, qs, kb, vb, D, D, js, je, k0, v0, score);\n",
     "st.acc[0][0]"),
    ("warps merged", "  tc_block_merge<D, ROWS>(st, ms, xs, M, L);\n", "st.acc[0][0] + M[0]"),
)  # fmt: skip


def _cut_source(source: str, k: int) -> str:
    phase, anchor, value = CUTS[k]
    assert source.count(anchor) >= 1, phase
    cut = (
        "  { __syncthreads();\n"
        f"    if (threadIdx.x < 8) y[threadIdx.x] = from_f<T>({value});\n"
        "    return; }\n"
    )
    at = source.index(anchor, source.index("gqa_decode_tc("))  # in that kernel
    at += len(anchor)
    return source[:at] + cut + source[at:]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="0.5b")
    ap.add_argument("--contexts", default="16,32000")
    ap.add_argument("--repeats", type=int, default=30)
    a = ap.parse_args(argv)
    from onnxep.providers_cuda.ops import decode_tc_cuda as tc

    full = tc.DECODE_TC_SOURCE
    copy_tbs = copy_bandwidth()
    for ctx in [int(c) for c in a.contexts.split(",")]:
        for k in [*range(len(CUTS)), None]:
            tc.DECODE_TC_SOURCE = full if k is None else _cut_source(full, k)
            try:
                row = measure(a.shape, ctx, repeats=a.repeats, copy_tbs=copy_tbs, trace=True)
            finally:
                tc.DECODE_TC_SOURCE = full
            us = {x["kernel"].split("<")[0].split()[-1]: x["us_per_layer"] for x in row["kernels"]}
            print(json.dumps({"context": ctx, "cut": "full" if k is None else CUTS[k][0],
                              "decode_us": us.get("gqa_decode_tc"),
                              "step_us": row["us_per_call"]}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
