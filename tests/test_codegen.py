"""Runs after the first use generated straight-line code and the shape cache: same results."""

from __future__ import annotations

import numpy as np
import pytest

import onnxep
from onnxep.tools.conformance import excluded_reason, load_cases, run_case


@pytest.mark.parametrize("category", ["node", "pytorch-converted", "pytorch-operator"])
def test_backend_cases_give_the_same_results_on_repeated_runs(category):
    failures = []
    for case in load_cases(category):
        if excluded_reason(case.name, category):
            continue
        r = run_case(case, category, ["cpu"], repeat=3)
        if not r.ok:
            failures.append(f"{r.name}: {r.reason}")
    assert not failures, "\n".join(failures[:20])


def test_shape_cache_hits_and_keys_by_shape():
    from pathlib import Path

    path = Path(__file__).parent / "data" / "llama_kv.onnx"
    sess = onnxep.InferenceSession(str(path), providers=["cpu"])
    rng = np.random.default_rng(0)

    def feeds(seq, past):
        f = {"input_ids": rng.integers(0, 512, (1, seq)).astype(np.int64)}
        for arg in sess.get_inputs()[1:]:
            f[arg.name] = rng.standard_normal((1, 2, past, 64)).astype(np.float32)
        return f

    steps = [s for s in sess.compiled.plan.steps if s.shape_only]
    assert any(s.op_type == "Shape" for s in steps)
    assert any(s.op_type == "Range" for s in steps)
    a, b = feeds(3, 5), feeds(4, 2)
    want_a, want_b = sess.run(None, a), sess.run(None, b)  # checked first runs
    for _ in range(3):
        for f, want in ((a, want_a), (b, want_b)):
            for x, y in zip(sess.run(None, f), want):
                np.testing.assert_array_equal(x, y)
    cache = sess.compiled.executor.shape_cache
    assert cache.hits >= 4 and len(cache.entries) == 2
