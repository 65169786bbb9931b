"""onnxruntime parity for com.microsoft DecoderMaskedMultiHeadAttention: self attention on
shared past/present buffers (the only self-attention form onnxruntime's CPU kernel runs),
masks, attention bias, input bias, output_qk, custom scale, beam search through
cache_indirection, and cross attention."""

from __future__ import annotations

import numpy as np
import pytest
from contrib_cases import one_node, run_both

pytest.importorskip("onnxruntime")

B, N, HEAD, PAST, CAP = 2, 2, 4, 3, 6
HID = N * HEAD
OP = "DecoderMaskedMultiHeadAttention"


def _f(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _compare(inputs, outputs, attrs):
    model = one_node(OP, inputs, outputs, {"num_heads": N, **attrs})
    feeds = {n: a for n, a in inputs if n}
    got, ref = run_both(model, feeds)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.shape == r.shape
        np.testing.assert_allclose(g, r, atol=2e-6, rtol=1e-5)


SELF_CASES = ["plain", "mask", "attention_bias", "bias", "qk", "scale", "first_step"]


@pytest.mark.parametrize("case", SELF_CASES)
@pytest.mark.parametrize("beams", [1, 2])
def test_self_attention_on_shared_buffers(case, beams):
    if case == "attention_bias" and beams > 1:
        pytest.skip(
            "onnxruntime's CPU kernel reads attention_bias out of bounds under beam search "
            "(wrong numbers here, a segmentation fault in a standalone run)"
        )
    rng = np.random.default_rng(SELF_CASES.index(case) + 10 * beams)
    bb = B * beams
    past = 0 if case == "first_step" else PAST
    inputs = [("q", _f(rng, bb, 1, HID)), ("k", _f(rng, bb, 1, HID)), ("v", _f(rng, bb, 1, HID))]
    mask = (rng.random((bb, past + 1)) > 0.3).astype(np.int32)
    mask[:, -1] = 1
    inputs.append(("mask", mask) if case == "mask" else ("", None))
    inputs.append(("ab", _f(rng, bb, N, 1, past + 1)) if case == "attention_bias" else ("", None))
    inputs += [("pk", _f(rng, bb, N, CAP, HEAD)), ("pv", _f(rng, bb, N, CAP, HEAD))]
    inputs.append(("plen", np.array(past, np.int32)))
    if beams > 1:
        inputs.append(("beams", np.array(beams, np.int32)))
        inputs.append(("ci", rng.integers(0, beams, (B, beams, CAP)).astype(np.int32)))
    else:
        inputs += [("", None), ("", None)]
    inputs.append(("bias", _f(rng, 3 * HID)) if case == "bias" else ("", None))
    outputs = [("y", np.float32), ("pk_out", np.float32), ("pv_out", np.float32)]
    attrs = {"past_present_share_buffer": 1}
    if case == "qk":
        outputs.append(("qk", np.float32))
        attrs["output_qk"] = 1
    if case == "scale":
        attrs["scale"] = 0.3
    _compare(inputs, outputs, attrs)


@pytest.mark.parametrize("case", ["plain", "mask", "bias"])
def test_cross_attention(case):
    rng = np.random.default_rng(3)
    length = 5
    inputs = [("q", _f(rng, B, 1, HID)), ("ck", _f(rng, B, N, length, HEAD))]
    inputs.append(("cv", _f(rng, B, N, length, HEAD)))
    if case == "mask":
        inputs.append(("mask", np.array([[1, 1, 0, 1, 1], [1, 1, 1, 1, 0]], np.int32)))
    if case == "bias":
        inputs += [("", None)] * 7 + [("bias", _f(rng, 3 * HID))]
    _compare(inputs, [("y", np.float32)], {})
