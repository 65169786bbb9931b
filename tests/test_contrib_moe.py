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


def _qweights(rng, n, k, bits, block, with_zp):
    w = rng.integers(0, 256, (E, n, k * bits // 8), dtype=np.uint8)
    s = rng.uniform(0.01, 0.05, (E, n) if not block else (E, n, k // block)).astype(np.float32)
    if not with_zp:
        return w, s, None
    zshape = (E, (n * bits + 7) // 8) if not block else (E, n, ((k // block) * bits + 7) // 8)
    return w, s, rng.integers(0, 256, zshape, dtype=np.uint8)


QHID, QINTER = 32, 64


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("block", [0, 16, 32])
@pytest.mark.parametrize("with_zp", [False, True])
@pytest.mark.parametrize("act", ["swiglu", "silu", "relu"])
def test_qmoe(bits, block, with_zp, act):
    if bits == 2 and block == 32 and act == "swiglu":
        pytest.skip(
            "onnxruntime's 2-bit block-32 experts differ from the dequantized product when "
            "FC1 has 128 rows of one block (0.2-0.5% of the range); see docs/contrib_ops.md"
        )
    rng = np.random.default_rng(bits * 7 + block)
    fs = 2 if act == "swiglu" else 1
    w1, s1, z1 = _qweights(rng, fs * QINTER, QHID, bits, block, with_zp)
    w2, s2, z2 = _qweights(rng, QHID, QINTER, bits, block, with_zp)
    b1 = (rng.standard_normal((E, fs * QINTER)) * 0.1).astype(np.float32)
    b2 = (rng.standard_normal((E, QHID)) * 0.1).astype(np.float32)
    x = rng.standard_normal((T, QHID)).astype(np.float32)
    probs = rng.standard_normal((T, E)).astype(np.float32)
    inputs = [("x", x), ("probs", probs), ("w1", w1), ("s1", s1), ("b1", b1)]
    inputs += [("w2", w2), ("s2", s2), ("b2", b2)]
    if with_zp:
        inputs += [("", None)] * 3 + [("z1", z1), ("z2", z2)]
    attrs = {"k": 2, "activation_type": act, "expert_weight_bits": bits}
    attrs |= {"swiglu_fusion": 1} if act == "swiglu" else {}
    attrs |= {"block_size": block} if block else {}
    # onnxruntime's CPU QMoE renormalizes the top-k weights whatever this attribute says
    # (see test_qmoe_unnormalized_is_moe for 0)
    attrs["normalize_routing_weights"] = 1
    consts = {n for n, _ in inputs if n not in ("x", "probs", "")}
    model = one_node("QMoE", inputs, [("y", np.float32)], attrs, consts)
    got, ref = run_both(model, {"x": x, "probs": probs})
    scale = float(np.abs(ref[0]).max())
    np.testing.assert_allclose(got[0], ref[0], atol=2e-6 * scale, rtol=1e-5)


@pytest.mark.parametrize("level", [0, 4])
@pytest.mark.parametrize("router_weights", [False, True])
@pytest.mark.parametrize("rank", [2, 3])
def test_qmoe_accuracy_level_and_router_weights(level, router_weights, rank):
    """accuracy_level 4 rounds a block-wise 4-bit expert's activations to int8 per block, as
    onnxruntime's CPU kernel does; router_weights mix while router_probs choose."""
    rng = np.random.default_rng(21)
    w1, s1, _ = _qweights(rng, 2 * QINTER, QHID, 4, 16, False)
    w2, s2, _ = _qweights(rng, QHID, QINTER, 4, 16, False)
    x = rng.standard_normal((T, QHID) if rank == 2 else (2, T // 2, QHID)).astype(np.float32)
    probs = rng.standard_normal((T, E)).astype(np.float32)
    inputs = [("x", x), ("probs", probs), ("w1", w1), ("s1", s1), ("", None)]
    inputs += [("w2", w2), ("s2", s2)]
    feeds = {"x": x, "probs": probs}
    if router_weights:
        inputs += [("", None)] * 7 + [("rw", rng.uniform(0, 1, (T, E)).astype(np.float32))]
        feeds["rw"] = inputs[-1][1]
    attrs = {"k": 2, "activation_type": "swiglu", "swiglu_fusion": 1, "block_size": 16}
    attrs |= {"accuracy_level": level, "normalize_routing_weights": 1}
    model = one_node("QMoE", inputs, [("y", np.float32)], attrs, {"w1", "s1", "w2", "s2"})
    got, ref = run_both(model, feeds)
    scale = float(np.abs(ref[0]).max())
    np.testing.assert_allclose(got[0], ref[0], atol=2e-6 * scale, rtol=1e-5)


@pytest.mark.parametrize("k", [1, 2])
def test_qmoe_unnormalized_is_moe(k):
    """With normalize_routing_weights=0 the mixing weights are the softmax probabilities, as
    the spec and onnxruntime's MoE have it (its CPU QMoE renormalizes regardless): QMoE is
    then onnxruntime's MoE on the dequantized experts."""
    from onnxep.providers.ops._contrib import dequantize_nbits

    rng = np.random.default_rng(31)
    w1, s1, z1 = _qweights(rng, 2 * QINTER, QHID, 4, 16, True)
    w2, s2, z2 = _qweights(rng, QHID, QINTER, 4, 16, True)
    x = rng.standard_normal((T, QHID)).astype(np.float32)
    probs = rng.standard_normal((T, E)).astype(np.float32)
    attrs = {
        "k": k,
        "activation_type": "swiglu",
        "swiglu_fusion": 1,
        "normalize_routing_weights": 0,
    }
    inputs = [
        ("x", x),
        ("probs", probs),
        ("w1", w1),
        ("s1", s1),
        ("", None),
        ("w2", w2),
        ("s2", s2),
    ]
    inputs += [("", None)] * 4 + [("z1", z1), ("z2", z2)]
    model = one_node(
        "QMoE",
        inputs,
        [("y", np.float32)],
        {**attrs, "block_size": 16},
        {"w1", "s1", "w2", "s2", "z1", "z2"},
    )
    feeds = {"x": x, "probs": probs}
    got = onnxep.InferenceSession(model, providers=["cpu"]).run(None, feeds)

    def dense(w, s, z, n, kk):
        return np.stack(
            [
                dequantize_nbits(
                    w[e],
                    s[e],
                    z[e],
                    None,
                    n=n,
                    k=kk,
                    bits=4,
                    block_size=16,
                    dtype=np.float32,
                    xp=np,
                )
                for e in range(E)
            ]
        )

    floats = [("x", x), ("probs", probs), ("w1", dense(w1, s1, z1, 2 * QINTER, QHID))]
    floats += [("", None), ("w2", dense(w2, s2, z2, QHID, QINTER))]
    _, ref = run_both(one_node("MoE", floats, [("y", np.float32)], attrs, {"w1", "w2"}), feeds)
    np.testing.assert_allclose(got[0], ref[0], atol=1e-5, rtol=1e-4)
