"""Small graphs of attention written out in standard ops, the forms torch exports (no tests here).

Shared by test_fusions_attention.py (on the ``fusions`` test provider) and
tests/cuda/test_cuda_attention_fusion.py (on the GPU). Only onnx and NumPy are imported: the
GPU tests import this module outside the tests/ conftest.
"""

from __future__ import annotations

import math

import numpy as np
from onnx import TensorProto, helper, numpy_helper
from test_fusions_graphs import ELEM, F16, F32, make_model, tensor

B, HQ, HKV, S, T, D = 2, 4, 2, 3, 5, 8
node = helper.make_node


def const(name, value, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(value, dtype), name)


def attention_model(
    dt=F32,
    key="transpose",
    scale="div",
    mask=None,
    softmax_cast=False,
    nan_guard=False,
    gqa=False,
    escape=None,
    axis=-1,
    kv_heads=None,
):
    """``MatMul(Softmax(mask(scale(q @ kᵀ))), v)`` in one of the forms exporters write.

    key: ``transpose`` (Transpose of K [B,H,T,D]), ``bshd`` (K given as [B,T,H,D]),
    ``rank3`` (Reshape -> Transpose -> Reshape), ``pre`` (kᵀ given as [B,H,D,T]).
    scale: ``div`` / ``mul`` (on the scores), ``split`` (a square root on q and on kᵀ),
    ``none``, ``input`` (by a graph input: not a constant). mask: None, ``add`` (a float
    [B,1,S,T] mask added), ``where`` (Where(cond, -inf, scores)), ``where0`` (filled with 0).
    """
    e = ELEM[dt]
    hk = kv_heads or (HKV if gqa else HQ)
    nodes, inits = [], [const("c", math.sqrt(D), dt), const("r", D**-0.25, dt)]
    inputs = [tensor("q", [B, HQ, S, D], e)]
    kshape = {"bshd": [B, T, hk, D], "pre": [B, hk, D, T]}.get(key, [B, hk, T, D])
    if key == "mqa-broadcast":  # one K head broadcast by the MatMul, but V of every head
        key, kshape = "transpose", [B, 1, T, D]
    inputs += [tensor("k", kshape, e), tensor("v", [B, hk, T, D], e)]
    k, v = "k", "v"
    if gqa:  # repeat_interleave of the heads, as torch exports it
        inits += [
            const("ax2", [2], np.int64),
            const("rep", [1, 1, HQ // HKV, 1, 1], np.int64),
            const("hq_shape", [B, HQ, T, D], np.int64),
        ]
        for name in ("k", "v"):
            nodes += [
                node("Unsqueeze", [name, "ax2"], [f"{name}_u"]),
                node("Expand", [f"{name}_u", "rep"], [f"{name}_e"]),
                node("Reshape", [f"{name}_e", "hq_shape"], [f"{name}_rep"]),
            ]
        k, v = "k_rep", "v_rep"
    if key == "transpose":
        nodes.append(node("Transpose", [k], ["kt"], perm=[0, 1, 3, 2]))
    elif key == "bshd":
        nodes.append(node("Transpose", [k], ["kt"], perm=[0, 2, 3, 1]))
    elif key in ("rank3", "rank3-scrambled"):  # scrambled: a reshape that is no transpose
        flat = [-1, T, D] if key == "rank3" else [-1, D, T]
        inits += [const("flat", flat, np.int64), const("back", [B, HQ, D, T], np.int64)]
        nodes += [
            node("Reshape", [k, "flat"], ["k3"]),
            node("Transpose", ["k3"], ["k3t"], perm=[0, 2, 1]),
            node("Reshape", ["k3t", "back"], ["kt"]),
        ]
    else:
        nodes.append(node("Identity", [k], ["kt"]))
    q, kt = "q", "kt"
    if scale == "split":
        nodes += [node("Mul", ["q", "r"], ["qs"]), node("Mul", ["r", "kt"], ["kts"])]
        q, kt = "qs", "kts"
    nodes.append(node("MatMul", [q, kt], ["scores"], name="qk"))
    s = "scores"
    if scale in ("div", "mul", "input"):
        if scale == "mul":
            inits.append(const("inv", 1 / math.sqrt(D), dt))
            nodes.append(node("Mul", ["inv", s], ["scaled"]))
        elif scale == "div":
            nodes.append(node("Div", [s, "c"], ["scaled"]))
        else:
            inputs.append(tensor("sc", [], e))
            nodes.append(node("Mul", [s, "sc"], ["scaled"]))
        s = "scaled"
    if mask == "add":
        inputs.append(tensor("mask", [B, 1, S, T], e))
        nodes.append(node("Add", ["mask", s], ["masked"]))
        s = "masked"
    elif mask in ("where", "where0"):
        inputs.append(tensor("cond", [S, T], TensorProto.BOOL))
        inits.append(const("fill", -np.inf if mask == "where" else 0.0, dt))
        nodes.append(node("Where", ["cond", "fill", s], ["masked"]))
        s = "masked"
    if softmax_cast:
        nodes += [
            node("Cast", [s], ["wide"], to=TensorProto.FLOAT),
            node("Softmax", ["wide"], ["p32"], axis=axis),
            node("Cast", ["p32"], ["probs"], to=e),
        ]
    else:
        nodes.append(node("Softmax", [s], ["probs"], axis=axis))
    p = "probs"
    if nan_guard:
        inits.append(const("zero", 0.0, dt))
        nodes += [
            node("IsNaN", [p], ["nan"]),
            node("Where", ["nan", "zero", p], ["guarded"]),
        ]
        p = "guarded"
    nodes.append(node("MatMul", [p, v], ["y"], name="pv"))
    outputs = [tensor("y", [B, HQ, S, D], e)]
    if escape == "output":
        outputs.append(tensor("scores", [B, HQ, S, T], e))
    elif escape == "consumer":
        nodes.append(node("Neg", ["probs"], ["neg"]))
        outputs.append(tensor("neg", [B, HQ, S, T], e))
    return make_model(nodes, inputs, outputs, inits)


def feeds(model, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for v in model.graph.input:
        t = v.type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        if t.elem_type == TensorProto.BOOL:  # a causal pattern: no row entirely hidden
            out[v.name] = np.triu(np.ones(shape, bool), k=1 + shape[1] - shape[0])
            continue
        dt = F16 if t.elem_type == TensorProto.FLOAT16 else F32
        out[v.name] = rng.standard_normal(shape).astype(dt)
    return out


#: Forms the fusion takes, by id: keyword arguments of :func:`attention_model`.
FORMS = {
    "transpose-div": {},
    "bshd-mul": {"key": "bshd", "scale": "mul"},
    "rank3-split": {"key": "rank3", "scale": "split"},
    "pre-transposed-unscaled": {"key": "pre", "scale": "none"},
    "mqa-broadcast-by-matmul": {"kv_heads": 1},
    "add-mask": {"mask": "add"},
    "where-mask-nan-guard": {"mask": "where", "nan_guard": True},
    "split-add-mask-nan-guard": {
        "key": "rank3",
        "scale": "split",
        "mask": "add",
        "nan_guard": True,
    },
}
#: GQA forms (K and V heads repeated), folded into the op's head groups.
GQA_FORMS = {
    "gqa": {"gqa": True},
    "gqa-where-mask": {"gqa": True, "mask": "where"},
    "gqa-rank3-split-add-mask": {"gqa": True, "key": "rank3", "scale": "split", "mask": "add"},
}
