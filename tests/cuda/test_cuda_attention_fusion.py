"""fuse_attention on the GPU: each form of tests/attention_graphs.py fused into onnxep::Attention
on ``["cuda"]`` alone against the same graph with the fusion off, within the dtype's tolerance
(the fusion is tolerance-level). test_fusions_attention.py runs the same graphs on the CPU
reference; the exported decoders are compared with every fusion on in test_cuda_fusions.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import onnxep

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

import attention_graphs as G  # noqa: E402
from test_fusions_graphs import assert_like_unfused  # noqa: E402

pytest.importorskip("cupy", reason="the CUDA tests need CuPy and a GPU")

PASS = "fuse_attention"
CASES = {
    f"{form}-{dt.__name__}": (kw, dt)
    for forms in (G.FORMS, G.GQA_FORMS)
    for form, kw in forms.items()
    for dt in (G.F32, G.F16)
}
CASES["f16-float32-softmax"] = ({"mask": "add", "softmax_cast": True}, G.F16)


def _session(model, off=()):
    opts = onnxep.SessionOptions(disable_fallback=True, disabled_rewrites=list(off))
    return onnxep.InferenceSession(model, opts, providers=["cuda"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_attention_matches_unfused_on_cuda(case):
    kw, dt = CASES[case]
    model = G.attention_model(dt, **kw)
    fused, plain = _session(model), _session(model, off=[PASS])
    (rep,) = [f for f in fused.placement().fusions if f.name == PASS and f.provider == "cuda"]
    assert rep.fired == 1, fused.placement().format()
    assert ("onnxep", "Attention") in {(n.domain, n.op_type) for n in fused.placement()}
    inputs = G.feeds(model)
    for got, want in zip(fused.run(None, inputs), plain.run(None, inputs)):
        assert_like_unfused(got, want, False, case)
