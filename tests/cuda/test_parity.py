"""Every op the CUDA provider claims against the CPU provider, per dtype, on random inputs.

The cases come from parity_table.py (see parity_cases.py); each must place
its op's nodes on CUDA, and every output must match the CPU provider within
the per-dtype tolerances (float32 atol 1e-5 rtol 1e-4, float16 atol 2.5e-3
rtol 1e-3; integers and bools exactly).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import parity_cases as pc  # noqa: E402

import onnxep  # noqa: E402
from onnxep.testing import compare_output  # noqa: E402

ENTRIES = [(op, case, dt) for op, cases in pc.table().items() for case, dt in cases]


@pytest.mark.parametrize(
    ("op", "case", "dtype"), ENTRIES, ids=[f"{op}-{c}-{d}" for op, c, d in ENTRIES]
)
def test_matches_cpu(op, case, dtype):
    model, feeds = pc.build(case, dtype, seed=1)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        cpu = onnxep.InferenceSession(model, providers=["cpu"])
        gpu = onnxep.InferenceSession(model, providers=["cuda", "cpu"])
        domain, name = op.split("::")
        nodes = [
            n
            for n in gpu.placement()
            if n.op_type == name and (n.domain or "") == domain and n.role == "compute"
        ]
        if op not in pc.FOLDED:
            assert nodes, f"no {op} node computes in the session's plan"
        off = [n for n in nodes if n.provider != "cuda"]
        assert not off, f"{op} ran on {off[0].provider}: {off[0].declined}"
        want = cpu.run(None, feeds)
        got = gpu.run(None, feeds)
    bad = []
    for arg, g, w in zip(gpu.get_outputs(), got, want):
        bad += [r for r in compare_output(arg.name, g, w, "cuda", "cpu") if not r.ok]
    assert not bad, "\n".join(r.describe() for r in bad)
