"""fuse_norm_matmul and fuse_quantized_swiglu on the ``fusions`` provider (the generic kernels).

``fuse_norm_matmul`` folds a SimplifiedLayerNormalization or SkipSimplifiedLayerNormalization
into the MatMulNT / MatMulNBits reading it (onnxep::NormMatMulNT / NormMatMulNBits, the
residual sum kept as an output when the graph reads it); ``fuse_quantized_swiglu`` folds a
packed SwiGLU into its joined MatMulNBits (onnxep::MatMulNBits). Both are exact: the fused
sessions' outputs are compared byte for byte with the same session's passes switched off,
and the factory's genai decoders give the unfused CPU session's greedy tokens
(test_fusions_genai.py). Refusals name why; the switches turn the passes off.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_fusions_genai import nbits_tables
from test_fusions_graphs import F16, F32, assert_like_unfused, make_model, tensor
from test_fusions_pattern import fusion, fusions_provider, ops, session

from onnxep.errors import InvalidModel
from onnxep.providers.fusions.norm_matmul import COMPUTED_INPUT, STATISTICS_READ
from onnxep.providers.fusions.quantized_swiglu import ODD_N
from onnxep.providers.fusions.reporting import ANOTHER_CONSUMER, GRAPH_OUTPUT
from onnxep.providers.node import NodeInfo, ValueInfo

MS = "com.microsoft"
NORM, QSWIGLU = "fuse_norm_matmul", "fuse_quantized_swiglu"
D, N = 64, 24
ELEM = {F32: TensorProto.FLOAT, F16: TensorProto.FLOAT16}


@pytest.fixture(scope="module")
def make():
    with fusions_provider() as register:
        yield register()


def norm_gemv_model(
    dt=F32, *, skip=True, gemv="matmul", swiglu=False, extra=None, bias_input=False, d=64, n=24,
    rows=(2, 3), level=0,
):  # fmt: skip
    """A (skip) RMS norm and the product reading it: a MatMul by a constant weight (which
    becomes MatMulNT) or a MatMulNBits (joined gate/up + packed SwiGLU with ``swiglu``;
    ``level``: its accuracy_level); the residual sum feeds a next Add. ``extra``: a second
    reader of the norm's output ("consumer"), the output as a graph output ("output"), or its
    inv_std_var read ("stats"). ``d`` x ``n`` weights; x of shape ``rows + (d,)``."""
    D, N, lead = d, n, list(rows)
    e = ELEM[dt]
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.random(D) + 0.5).astype(dt), "gamma")]
    outputs = [tensor("y", [*lead, N // 2 if swiglu else N], e)]
    nodes = []
    if skip:
        nodes.append(helper.make_node(
            "SkipSimplifiedLayerNormalization", ["x", "res", "gamma"],
            ["h", "", "inv" if extra == "stats" else "", "sum"], domain=MS, epsilon=1e-6,
        ))  # fmt: skip
        nodes.append(helper.make_node("Add", ["sum", "c"], ["z"], name="next_residual"))
        outputs.append(tensor("z", [*lead, D], e))
    else:
        nodes.append(helper.make_node(
            "SimplifiedLayerNormalization", ["x", "gamma"],
            ["h", "inv" if extra == "stats" else ""], axis=-1, epsilon=1e-6,
        ))  # fmt: skip
    if extra == "stats":
        outputs.append(tensor("inv", [*lead, 1], TensorProto.FLOAT))
    if gemv == "matmul":
        w = (rng.standard_normal((D, N)) / 8).astype(dt)
        inits.append(numpy_helper.from_array(w, "w"))
        nodes.append(helper.make_node("MatMul", ["h", "w"], ["y"], name="proj"))
    else:
        b, scales, zp = nbits_tables(rng, N, "packed", dtype=dt, k=D)
        names = ["h", "b", "s", "zp", "", "bias" if bias_input else ""]
        inits += [numpy_helper.from_array(b, "b"), numpy_helper.from_array(scales, "s"),
                  numpy_helper.from_array(zp, "zp")]  # fmt: skip
        out = "gu" if swiglu else "y"
        nodes.append(helper.make_node(
            "MatMulNBits", names, [out], domain=MS, name="proj", K=D, N=N, bits=4, block_size=32,
            accuracy_level=level,
        ))  # fmt: skip
        if bias_input:
            nodes.insert(0, helper.make_node("Neg", ["nb"], ["bias"]))
        if swiglu:
            nodes.append(helper.make_node("SwiGLU", ["gu"], ["y"], domain="onnxep", name="glu"))
    if extra == "consumer":
        nodes.append(helper.make_node("Neg", ["h"], ["nh"]))
        outputs.append(tensor("nh", [*lead, D], e))
    elif extra == "output":
        outputs.append(tensor("h", [*lead, D], e))
    inputs = [tensor("x", [*lead, D], e)]
    if skip:
        inputs += [tensor("res", [*lead, D], e), tensor("c", [*lead, D], e)]
    if bias_input:
        inputs.append(tensor("nb", [N], e))
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(MS, 1),
              helper.make_opsetid("onnxep", 1)]  # fmt: skip
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits),
                             opset_imports=opsets)  # fmt: skip


def _feeds(model, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for v in model.graph.input:
        t = v.type.tensor_type
        dt = F16 if t.elem_type == TensorProto.FLOAT16 else F32
        out[v.name] = rng.standard_normal([d.dim_value for d in t.shape.dim]).astype(dt)
    return out


def _exact(model, fused, plain):
    inputs = _feeds(model)
    outs = fused.run(None, inputs), plain.run(None, inputs)
    for arg, got, want in zip(fused.get_outputs(), *outs):
        assert_like_unfused(got, want, True, arg.name)


@pytest.mark.parametrize("dt", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("skip", [False, True], ids=["rms", "skip"])
def test_norm_folds_into_the_matmul_nt(make, dt, skip):
    model = norm_gemv_model(dt, skip=skip)
    fused = session(model, make)
    rep = fusion(fused, NORM)
    assert rep.by_rule == {"norm_matmul_nt": 1} and rep.exact, fused.placement().format()
    assert "NormMatMulNT" in ops(fused) and not any("Normalization" in o for o in ops(fused))
    _exact(model, fused, session(model, make, off=[NORM]))


@pytest.mark.parametrize("dt", [F32, F16], ids=["f32", "f16"])
@pytest.mark.parametrize("skip", [False, True], ids=["rms", "skip"])
def test_norm_folds_into_the_matmul_nbits(make, dt, skip):
    model = norm_gemv_model(dt, skip=skip, gemv="nbits")
    fused = session(model, make)
    assert fusion(fused, NORM).by_rule == {"norm_matmul_nbits": 1}
    assert ops(fused)[:1] == ["NormMatMulNBits"]
    _exact(model, fused, session(model, make, off=[NORM]))


@pytest.mark.parametrize("dt", [F32, F16], ids=["f32", "f16"])
def test_mlp_norm_gate_up_and_swiglu_become_one_node(make, dt):
    model = norm_gemv_model(dt, gemv="nbits", swiglu=True)
    fused = session(model, make)
    assert fusion(fused, QSWIGLU).by_rule == {"matmul_nbits_swiglu": 1}
    assert fusion(fused, QSWIGLU).exact
    assert fusion(fused, NORM).by_rule == {"norm_matmul_nbits": 1}
    assert sorted(ops(fused)) == ["Add", "NormMatMulNBits"]
    _exact(model, fused, session(model, make, off=[NORM, QSWIGLU]))
    # the SwiGLU fold alone: onnxep::MatMulNBits after the norm
    alone = session(model, make, off=[NORM])
    assert sorted(ops(alone)) == ["Add", "MatMulNBits", "SkipSimplifiedLayerNormalization"]
    _exact(model, alone, session(model, make, off=[NORM, QSWIGLU]))


@pytest.mark.parametrize(
    ("extra", "why"),
    [("consumer", ANOTHER_CONSUMER), ("output", GRAPH_OUTPUT), ("stats", STATISTICS_READ)],
)
@pytest.mark.parametrize("skip", [False, True], ids=["rms", "skip"])
def test_refused_when_the_norm_is_read_elsewhere(make, extra, why, skip):
    model = norm_gemv_model(skip=skip, extra=extra)
    sess = session(model, make)
    rep = fusion(sess, NORM)
    assert rep.fired == 0 and why in rep.refused, rep.refused
    _exact(model, sess, session(model, make, off=[NORM]))


def test_refused_when_the_gemv_reads_a_computed_bias(make):
    sess = session(norm_gemv_model(gemv="nbits", bias_input=True), make)
    rep = fusion(sess, NORM)
    assert rep.fired == 0 and COMPUTED_INPUT in rep.refused, rep.refused


def test_switched_off_it_leaves_the_norm(make):
    sess = session(norm_gemv_model(), make, off=[NORM])
    assert fusion(sess, NORM).state == "off"
    assert "SkipSimplifiedLayerNormalization" in ops(sess)


def test_odd_n_keeps_the_swiglu_a_node(make):
    rng = np.random.default_rng(0)
    b, scales, _ = nbits_tables(rng, 5, "none")
    nodes = [
        helper.make_node("MatMulNBits", ["a", "b", "s"], ["gu"], domain=MS, name="mm",
                         K=D, N=5, bits=4, block_size=32),
        helper.make_node("SwiGLU", ["gu"], ["y"], domain="onnxep", name="glu"),
    ]  # fmt: skip
    inits = [numpy_helper.from_array(b, "b"), numpy_helper.from_array(scales, "s")]
    model = make_model(nodes, [tensor("a", [1, D])], [tensor("y", [1, 2])], inits)
    model.opset_import.extend([helper.make_opsetid(MS, 1), helper.make_opsetid("onnxep", 1)])
    rep = fusion(session(model, make), QSWIGLU)
    assert rep.fired == 0 and ODD_N in rep.refused


def _node(op, ins, outs=1, **attrs):
    vis = tuple(None if i is None else ValueInfo(i, "tensor", np.dtype(F32)) for i in ins)
    return NodeInfo(
        op, "onnxep", "n", 1, attrs, vis, tuple(ValueInfo(f"o{j}") for j in range(outs))
    )


def test_the_ops_refuse_a_layout_they_cannot_read():
    from onnxep.providers.ops.op_onnxep_matmul_nbits import matmul_nbits
    from onnxep.providers.ops.op_onnxep_norm_matmul_nt import norm_matmul_nt

    with pytest.raises(InvalidModel, match="epsilon"):
        norm_matmul_nt(_node("NormMatMulNT", ["x", None, "g", None, "w"]), np)
    with pytest.raises(InvalidModel, match="x and gamma are required"):
        norm_matmul_nt(_node("NormMatMulNT", ["x", None, None, None, "w"], epsilon=1e-5), np)
    with pytest.raises(InvalidModel, match="no residual sum"):
        norm_matmul_nt(_node("NormMatMulNT", ["x", None, "g", None, "w"], 2, epsilon=1e-5), np)
    nbits = {"K": 32, "N": 5, "bits": 4, "block_size": 32, "activation": "swiglu"}
    with pytest.raises(InvalidModel, match="even N"):
        matmul_nbits(_node("MatMulNBits", ["a", "b", "s"], **nbits), np)
