"""onnxruntime parity for com.microsoft MoE and QMoE (integer experts) on one-node models."""

from __future__ import annotations

import numpy as np
import pytest
from contrib_cases import check, one_node, run_both

import onnxep

pytest.importorskip("onnxruntime")

T, HID, INTER, E = 6, 8, 12, 4


def _experts(rng, fused):
    fs = 2 if fused else 1
    w1 = (rng.standard_normal((E, fs * INTER, HID)) * 0.3).astype(np.float32)
    b1 = (rng.standard_normal((E, fs * INTER)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((E, HID, INTER)) * 0.3).astype(np.float32)
    b2 = (rng.standard_normal((E, HID)) * 0.1).astype(np.float32)
    return w1, b1, w2, b2


ACTS = [
    ("relu", {}),
    ("gelu", {}),
    ("silu", {}),
    ("identity", {}),
    ("swiglu", {"swiglu_fusion": 1}),
    ("swiglu", {"swiglu_fusion": 1, "activation_alpha": 1.702, "activation_beta": 1.0}),
    ("swiglu", {"swiglu_fusion": 1, "swiglu_limit": 0.5}),
]


@pytest.mark.parametrize("act,extra", ACTS)
@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("normalize", [0, 1])
@pytest.mark.parametrize("rank", [2, 3])
def test_moe(act, extra, k, normalize, rank):
    rng = np.random.default_rng(k + 3 * normalize)
    w1, b1, w2, b2 = _experts(rng, act == "swiglu")
    x = rng.standard_normal((T, HID) if rank == 2 else (2, T // 2, HID)).astype(np.float32)
    probs = rng.standard_normal((T, E)).astype(np.float32)
    inputs = [("x", x), ("probs", probs), ("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2)]
    attrs = {"k": k, "activation_type": act, "normalize_routing_weights": normalize, **extra}
    consts = {n for n, _ in inputs if n.startswith(("w", "b"))}
    check("MoE", inputs, [("y", np.float32)], attrs, consts, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("fusion", [0, 2])
@pytest.mark.parametrize("limit", [None, 0.7])
def test_moe_swiglu_layouts(fusion, limit):
    """SwiGLU with gate and linear halves concatenated (2) or in FC1 and FC3 (0): onnxruntime's
    CPU MoE takes only the interleaved layout (1), so the same experts written interleaved are
    its reference."""
    rng = np.random.default_rng(11)
    w1, b1, w2, b2 = _experts(rng, True)
    x = rng.standard_normal((T, HID)).astype(np.float32)
    probs = rng.standard_normal((T, E)).astype(np.float32)
    attrs = {"k": 2, "activation_type": "swiglu", "activation_alpha": 1.5, "activation_beta": 0.5}
    if limit is not None:
        attrs["swiglu_limit"] = limit
    gate, lin = (w1[:, 0::2], w1[:, 1::2]), (b1[:, 0::2], b1[:, 1::2])
    interleaved = [("x", x), ("probs", probs), ("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2)]
    weight_names = {"w1", "b1", "w2", "b2", "w3", "b3"}
    ref_model = one_node(
        "MoE", interleaved, [("y", np.float32)], {**attrs, "swiglu_fusion": 1}, weight_names
    )
    _, ref = run_both(ref_model, {"x": x, "probs": probs})
    if fusion == 2:
        weights = [("w1", np.concatenate(gate, axis=1)), ("b1", np.concatenate(lin, axis=1))]
        weights = [
            ("w1", np.concatenate(gate, axis=1)),
            ("b1", np.concatenate((b1[:, 0::2], b1[:, 1::2]), axis=1)),
        ]
        weights += [("w2", w2), ("b2", b2)]
    else:
        weights = [
            ("w1", gate[0]),
            ("b1", lin[0]),
            ("w2", w2),
            ("b2", b2),
            ("w3", gate[1]),
            ("b3", lin[1]),
        ]
    model = one_node(
        "MoE",
        [("x", x), ("probs", probs), *weights],
        [("y", np.float32)],
        {**attrs, "swiglu_fusion": fusion},
        weight_names,
    )
    got = onnxep.InferenceSession(model, providers=["cpu"]).run(None, {"x": x, "probs": probs})
    np.testing.assert_allclose(got[0], ref[0], atol=1e-5, rtol=1e-4)
