"""Hand-made one-node cases for claimed ops the ONNX node suite has no case for.

Each entry of ``CASES`` maps an op name to ``make(dtype, rng) -> (model,
feeds)`` for dtype ``"float32"`` or ``"float16"``: random inputs of a small
valid shape, following the input layouts that tests/test_contrib_*.py check
against onnxruntime.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

MS = "com.microsoft"


def _model(
    op: str, feeds: dict, names: list[str], outputs: list[str], attrs=None, domain=MS, consts=()
):
    """One node; inputs named in ``consts`` become initializers (weights), the rest feeds."""
    node = helper.make_node(op, names, outputs, domain=domain, **(attrs or {}))
    ins = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(feeds[n].dtype), None)
        for n in names
        if n and n not in consts
    ]
    inits = [numpy_helper.from_array(feeds[n], n) for n in consts]
    first = feeds[names[0]].dtype
    outs = [
        helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(first), None)
        for o in outputs
        if o
    ]
    graph = helper.make_graph([node], op, ins, outs, inits)
    m = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)]
    )
    m.ir_version = 10
    return m, {n: feeds[n] for n in names if n and n not in consts}


def _r(rng, shape, dt, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dt)


def gelu_like(op: str, with_bias: bool = False) -> Callable:
    def make(dtype, rng):
        f = {"X": _r(rng, (2, 3, 16), dtype, 3.0)}
        names = ["X"]
        if with_bias:
            f["bias"] = _r(rng, (16,), dtype)
            names.append("bias")
        return _model(op, f, names, ["Y"])

    return make


def bias_gelu(dtype, rng):
    f = {"A": _r(rng, (2, 3, 16), dtype, 3.0), "B": _r(rng, (16,), dtype)}
    return _model("BiasGelu", f, ["A", "B"], ["C"])


def fused_matmul(dtype, rng):
    f = {"A": _r(rng, (2, 4, 3), dtype), "B": _r(rng, (2, 5, 4), dtype)}
    return _model("FusedMatMul", f, ["A", "B"], ["Y"], {"transA": 1, "transB": 1, "alpha": 0.5})


def simplified_ln(domain: str) -> Callable:
    def make(dtype, rng):
        f = {"X": _r(rng, (2, 3, 16), dtype, 2.0), "scale": _r(rng, (16,), dtype)}
        attrs = {"axis": -1, "epsilon": 1e-5}
        return _model("SimplifiedLayerNormalization", f, ["X", "scale"], ["Y"], attrs, domain)

    return make


def skip_ln(simplified: bool) -> Callable:
    def make(dtype, rng):
        f = {
            "input": _r(rng, (2, 3, 16), dtype, 2.0),
            "skip": _r(rng, (2, 3, 16), dtype),
            "gamma": _r(rng, (16,), dtype),
        }
        names = ["input", "skip", "gamma"]
        if not simplified:
            f["beta"] = _r(rng, (16,), dtype)
            f["bias"] = _r(rng, (16,), dtype)
            names += ["beta", "bias"]
        op = "SkipSimplifiedLayerNormalization" if simplified else "SkipLayerNormalization"
        return _model(op, f, names, ["output"], {"epsilon": 1e-5})

    return make


def gated_rms_norm(dtype, rng):
    f = {
        "X": _r(rng, (2, 3, 16), dtype, 2.0),
        "scale": _r(rng, (8,), dtype),
        "gate": _r(rng, (2, 3, 16), dtype, 3.0),
    }
    attrs = {"epsilon": 1e-5, "activation": "silu"}
    return _model("GatedRMSNorm", f, ["X", "scale", "gate"], ["Y"], attrs)


def linear_attention_gate(dtype, rng):
    f = {
        "a": _r(rng, (2, 3, 4), dtype, 4.0),
        "dt_bias": _r(rng, (4,), np.float32),
        "decay_scale": -np.exp(_r(rng, (4,), np.float32)),
        "b": _r(rng, (2, 3, 4), dtype, 4.0),
    }
    return _model("LinearAttentionGate", f, ["a", "dt_bias", "decay_scale", "b"], ["decay", "beta"])


def causal_conv(dtype, rng):
    f = {
        "input": _r(rng, (2, 4, 7), dtype),
        "weight": _r(rng, (4, 1, 4), dtype),
        "bias": _r(rng, (4,), dtype),
        "past_state": _r(rng, (2, 4, 3), dtype),
    }
    names = ["input", "weight", "bias", "past_state"]
    attrs = {"activation": "silu"}
    return _model("CausalConvWithState", f, names, ["output", "present_state"], attrs)


def linear_attention(dtype, rng):
    b, t, h, dk, dv = 2, 3, 2, 8, 8
    f = {
        "query": _r(rng, (b, t, h * dk), dtype),
        "key": _r(rng, (b, t, h * dk), dtype, 0.3),
        "value": _r(rng, (b, t, h * dv), dtype),
        "past_state": _r(rng, (b, h, dk, dv), dtype, 0.5),
        "decay": (-np.abs(_r(rng, (b, t, h), np.float32, 0.5))).astype(dtype),
    }
    names = ["query", "key", "value", "past_state", "decay"]
    attrs = {"q_num_heads": h, "kv_num_heads": h, "update_rule": "gated"}
    return _model("LinearAttention", f, names, ["output", "present_state"], attrs)


def gated_linear_attention(dtype, rng):
    """onnxep::GatedLinearAttention with its gates and both per-head L2 norms (GQA heads)."""
    b, t, hq, hkv, dk, dv = 2, 3, 4, 2, 8, 8
    f = {
        "query": _r(rng, (b, t, hq * dk), dtype),
        "key": _r(rng, (b, t, hkv * dk), dtype),
        "value": _r(rng, (b, t, hkv * dv), dtype),
        "past_state": _r(rng, (b, hkv, dk, dv), dtype, 0.5),
        "a": _r(rng, (b, t, hkv), dtype),
        "dt_bias": _r(rng, (hkv,), np.float32, 0.5),
        "decay_scale": -np.exp(_r(rng, (hkv,), np.float32, 0.5)),
        "b": _r(rng, (b, t, hkv), dtype),
    }
    attrs = {"q_num_heads": hq, "kv_num_heads": hkv, "update_rule": "gated_delta",
             "scale": 1.0, "q_l2_norm": 1, "k_l2_norm": 1, "q_scale": dk**-0.5}  # fmt: skip
    m, feeds = _model("GatedLinearAttention", f, list(f), ["output", "present_state"], attrs,
                      domain="onnxep")  # fmt: skip
    m.opset_import.append(helper.make_opsetid("onnxep", 1))
    return m, feeds


def rope_cache(max_len: int, rot: int, dtype):
    inv = 1.0 / (10000 ** (np.arange(0, rot, 2) / rot))
    ang = np.arange(max_len)[:, None] * inv[None, :]
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


def rotary(dtype, rng):
    b, s, nh, hd = 2, 5, 3, 16
    cos, sin = rope_cache(24, hd, dtype)
    f = {
        "input": _r(rng, (b, s, nh * hd), dtype),
        "position_ids": rng.integers(0, 24, (b, s)).astype(np.int64),
        "cos_cache": cos,
        "sin_cache": sin,
    }
    names = ["input", "position_ids", "cos_cache", "sin_cache"]
    return _model("RotaryEmbedding", f, names, ["output"], {"interleaved": 0})


def mrotary(dtype, rng):
    b, s, nh, hd = 2, 5, 2, 16
    cos, sin = rope_cache(24, hd, dtype)
    f = {
        "input": _r(rng, (b, s, nh * hd), dtype),
        "position_ids": rng.integers(0, 24, (3, b, s)).astype(np.int64),
        "cos_cache": cos,
        "sin_cache": sin,
    }
    names = ["input", "position_ids", "cos_cache", "sin_cache"]
    attrs = {"mrope_section": [2, 3, 3], "num_heads": nh}
    return _model("MRotaryEmbedding", f, names, ["output"], attrs)


def group_query_attention(dtype, rng):
    b, s, nh, nkv, hd, past = 2, 3, 4, 2, 8, 5
    f = {
        "query": _r(rng, (b, s, nh * hd), dtype),
        "key": _r(rng, (b, s, nkv * hd), dtype),
        "value": _r(rng, (b, s, nkv * hd), dtype),
        "past_key": _r(rng, (b, nkv, past, hd), dtype),
        "past_value": _r(rng, (b, nkv, past, hd), dtype),
        # every row full: outputs past the valid length are unspecified
        "seqlens_k": np.full((b,), past + s - 1, np.int32),
        "total_sequence_length": np.array(past + s, np.int32),
    }
    names = list(f)
    attrs = {"num_heads": nh, "kv_num_heads": nkv}
    return _model(
        "GroupQueryAttention", f, names, ["output", "present_key", "present_value"], attrs
    )


def multi_head_attention(dtype, rng):
    b, s, nh, hd = 2, 4, 2, 8
    f = {
        "query": _r(rng, (b, s, nh * hd), dtype),
        "key": _r(rng, (b, 6, nh * hd), dtype),
        "value": _r(rng, (b, 6, nh * hd), dtype),
    }
    return _model("MultiHeadAttention", f, ["query", "key", "value"], ["output"], {"num_heads": nh})


def attention_contrib(dtype, rng):
    b, s, din, nh, hd = 2, 4, 16, 2, 8
    f = {
        "input": _r(rng, (b, s, din), dtype),
        "weights": _r(rng, (din, 3 * nh * hd), dtype, 0.3),
        "bias": _r(rng, (3 * nh * hd,), dtype),
    }
    return _model("Attention", f, ["input", "weights", "bias"], ["output"], {"num_heads": nh})


def matmul_nbits(dtype, rng):
    k, n, bits, block = 64, 8, 4, 32
    blocks = k // block
    f = {
        "A": _r(rng, (3, k), dtype),
        "B": rng.integers(0, 256, (n, blocks, block * bits // 8), dtype=np.uint8),
        "scales": (rng.random((n, blocks)) * 0.1 + 0.01).astype(dtype),
    }
    attrs = {"K": k, "N": n, "bits": bits, "block_size": block}
    # the CUDA kernel repacks constant weights once, as exports carry them
    return _model("MatMulNBits", f, ["A", "B", "scales"], ["Y"], attrs, consts=("B", "scales"))


def gather_block_quantized(dtype, rng):
    rows, cols, block = 6, 64, 32
    f = {
        "data": rng.integers(0, 256, (rows, cols // 2)).astype(np.uint8),
        "indices": rng.integers(0, rows, (2, 3)).astype(np.int64),
        "scales": rng.uniform(0.01, 0.2, (rows, cols // block)).astype(dtype),
    }
    attrs = {"bits": 4, "block_size": block, "gather_axis": 0, "quantize_axis": 1}
    m, feeds = _model("GatherBlockQuantized", f, ["data", "indices", "scales"], ["y"], attrs)
    m.graph.output[0].type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return m, feeds


def global_lp_pool(dtype, rng):
    f = {"X": _r(rng, (2, 3, 5, 4), dtype)}
    return _model("GlobalLpPool", f, ["X"], ["Y"], {"p": 2}, domain="")


def fused_conv(dtype, rng):
    """Conv + bias + Relu with asymmetric pads and two groups (the cuDNN epilogue path)."""
    f = {
        "X": _r(rng, (2, 4, 9, 8), dtype),
        "W": _r(rng, (6, 2, 3, 3), dtype, 0.3),
        "B": _r(rng, (6,), dtype),
    }
    attrs = {"activation": "Relu", "group": 2, "pads": [1, 0, 1, 2], "kernel_shape": [3, 3]}
    return _model("FusedConv", f, ["X", "W", "B"], ["Y"], attrs, consts=("W", "B"))


def fused(op: str, inputs: dict[str, tuple[int, ...]], consts: tuple[str, ...] = ()) -> Callable:
    """A case for an op onnxep's fusion passes emit (domain "onnxep", imported at version 1)."""

    def make(dtype, rng):
        f = {n: _r(rng, shape, dtype) for n, shape in inputs.items()}
        if op == "Rsqrt":
            f["X"] = (np.abs(f["X"]) + 0.5).astype(f["X"].dtype)  # real roots, no infinities
        m, feeds = _model(op, f, list(inputs), ["Y"], domain="onnxep", consts=consts)
        m.opset_import.append(helper.make_opsetid("onnxep", 1))
        return m, feeds

    return make


def matmul_nt(dtype, rng):
    """Six rows of A (the GEMV path on the GPU), a bias and the SwiGLU epilogue."""
    f = {"A": _r(rng, (2, 3, 16), dtype), "Wt": _r(rng, (8, 16), dtype, 0.25)}
    f["bias"] = _r(rng, (8,), dtype)
    names, attrs = ["A", "Wt", "bias"], {"activation": "swiglu"}
    m, feeds = _model("MatMulNT", f, names, ["Y"], attrs, "onnxep", consts=("Wt", "bias"))
    m.opset_import.append(helper.make_opsetid("onnxep", 1))
    return m, feeds


def nbits_consts(rng, k, n, dtype, block=32):
    blocks = -(-k // block)
    b = rng.integers(0, 256, (n, blocks, block // 2), dtype=np.uint8)
    scales = (rng.random((n, blocks)) * 0.1 + 0.01).astype(dtype)
    zp = rng.integers(0, 256, (n, -(-blocks // 2)), dtype=np.uint8)
    return b, scales, zp


def onnxep_matmul_nbits(dtype, rng):
    """The joined gate/up product with its SwiGLU; float32 A at accuracy_level 4 (the
    factory's int4 decoders), float16 A at 0."""
    k, n = 64, 16
    b, scales, zp = nbits_consts(rng, k, n, dtype)
    f = {"A": _r(rng, (2, 3, k), dtype), "B": b, "scales": scales, "zero_points": zp}
    attrs = {"K": k, "N": n, "bits": 4, "block_size": 32, "activation": "swiglu"}
    attrs["accuracy_level"] = 4 if dtype == "float32" else 0
    names = ["A", "B", "scales", "zero_points"]
    m, feeds = _model("MatMulNBits", f, names, ["Y"], attrs, "onnxep", consts=tuple(names[1:]))
    m.opset_import.append(helper.make_opsetid("onnxep", 1))
    return m, feeds


def _norm_inputs(rng, dtype, k):
    return {
        "x": _r(rng, (2, 3, k), dtype),
        "skip": _r(rng, (2, 3, k), dtype),
        "gamma": (rng.random(k) + 0.5).astype(dtype),
    }


def norm_matmul_nt(dtype, rng):
    """A skip RMS norm in the GEMV's prologue (six rows), its residual sum kept, a bias."""
    k, n = 64, 24
    f = _norm_inputs(rng, dtype, k)
    f["Wt"], f["bias"] = _r(rng, (n, k), dtype, 0.125), _r(rng, (n,), dtype)
    names = ["x", "skip", "gamma", "", "Wt", "bias"]
    m, feeds = _model(
        "NormMatMulNT", f, names, ["Y", "sum"], {"epsilon": 1e-6, "activation": "none"},
        "onnxep", consts=("gamma", "Wt", "bias"),
    )  # fmt: skip
    m.opset_import.append(helper.make_opsetid("onnxep", 1))
    return m, feeds


def norm_matmul_nbits(dtype, rng):
    """A skip RMS norm, the joined gate/up MatMulNBits reading it and the SwiGLU, one node;
    float32 A at accuracy_level 4."""
    k, n = 64, 16
    f = _norm_inputs(rng, dtype, k)
    f["B"], f["scales"], f["zero_points"] = nbits_consts(rng, k, n, dtype)
    attrs = {"epsilon": 1e-6, "K": k, "N": n, "bits": 4, "block_size": 32}
    attrs.update(activation="swiglu", accuracy_level=4 if dtype == "float32" else 0)
    names = ["x", "skip", "gamma", "", "B", "scales", "zero_points"]
    m, feeds = _model(
        "NormMatMulNBits", f, names, ["Y", "sum"], attrs, "onnxep",
        consts=("gamma", "B", "scales", "zero_points"),
    )  # fmt: skip
    m.opset_import.append(helper.make_opsetid("onnxep", 1))
    return m, feeds


CASES: dict[str, Callable[[str, Any], tuple[onnx.ModelProto, dict]]] = {
    "::GlobalLpPool": global_lp_pool,
    f"{MS}::FusedConv": fused_conv,
    "::SimplifiedLayerNormalization": simplified_ln(""),
    f"{MS}::SimplifiedLayerNormalization": simplified_ln(MS),
    f"{MS}::SkipLayerNormalization": skip_ln(False),
    f"{MS}::SkipSimplifiedLayerNormalization": skip_ln(True),
    f"{MS}::Gelu": gelu_like("Gelu"),
    f"{MS}::FastGelu": gelu_like("FastGelu", with_bias=True),
    f"{MS}::QuickGelu": gelu_like("QuickGelu"),
    f"{MS}::BiasGelu": bias_gelu,
    f"{MS}::FusedMatMul": fused_matmul,
    f"{MS}::GatedRMSNorm": gated_rms_norm,
    f"{MS}::LinearAttentionGate": linear_attention_gate,
    f"{MS}::CausalConvWithState": causal_conv,
    f"{MS}::LinearAttention": linear_attention,
    f"{MS}::RotaryEmbedding": rotary,
    f"{MS}::MRotaryEmbedding": mrotary,
    f"{MS}::GroupQueryAttention": group_query_attention,
    f"{MS}::MultiHeadAttention": multi_head_attention,
    f"{MS}::Attention": attention_contrib,
    f"{MS}::MatMulNBits": matmul_nbits,
    f"{MS}::GatherBlockQuantized": gather_block_quantized,
    "onnxep::Attention": fused(
        "Attention", {"Q": (2, 4, 5, 8), "K": (2, 2, 7, 8), "V": (2, 2, 7, 8)}
    ),
    "onnxep::GatedLinearAttention": gated_linear_attention,
    "onnxep::Rsqrt": fused("Rsqrt", {"X": (2, 3, 16)}),
    "onnxep::SiLU": fused("SiLU", {"X": (2, 3, 16)}),
    "onnxep::SwiGLU": fused("SwiGLU", {"G": (2, 3, 16), "U": (2, 3, 16)}),
    # B is fed, not a constant: a constant weight becomes MatMulNT (fuse_transposed_weights)
    # and the plan would hold no MatMulBias; a fed weight keeps the op this case checks.
    "onnxep::MatMulBias": fused("MatMulBias", {"A": (2, 3, 16), "B": (16, 8), "C": (8,)}, ("C",)),
    "onnxep::MatMulNT": matmul_nt,
    "onnxep::MatMulNBits": onnxep_matmul_nbits,
    "onnxep::NormMatMulNT": norm_matmul_nt,
    "onnxep::NormMatMulNBits": norm_matmul_nbits,
}
