"""The fusions on genai-format decoders, whose values after contrib ops onnx leaves untyped.

``propagate_contrib_dtypes`` (a basic rewrite) types them from per-op rules,
so on the ``fusions`` provider (the CUDA pass list over the generic kernels)
SiLU/SwiGLU fire and the gate/up projections join (MatMul or MatMulNBits)
into the SwiGLU's packed input; greedy tokens equal the unfused CPU run's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_fusions_pattern import ALL, fusion, fusions_provider, session

import onnxep
from onnxep.providers import KernelLibrary
from onnxep.providers.fusions.shared_input_matmuls import MIXED_NBITS
from onnxep.rewrites.contrib_dtypes import RULES, UNTYPED
from onnxep.rewrites.propagate_dtypes import PropagateContribDtypes

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench/ is imported from the repo root, not installed
from bench.factory import build_genai_decoder  # noqa: E402

GENAI = Path(__file__).parent / "data" / "genai"
PROMPT = np.random.default_rng(5).integers(0, 200, 6)
STEPS = 6
#: Per pass on the 2-layer genai decoders: one SwiGLU MLP per layer, its gate and up joined.
#: Their norms are SkipSimplifiedLayerNormalization already (nothing for the RMS passes), and
#: Q, K and V are one packed projection.
MLP = {"fuse_silu": 2, "fuse_swiglu": 2, "fuse_shared_input_matmuls": 2}


@pytest.fixture(scope="module")
def make():
    with fusions_provider() as register:
        yield register()


@pytest.fixture(scope="module")
def factory(tmp_path_factory):
    """The factory's tiny genai decoders, built once: fp16, int4, int4 with zero points."""
    root = tmp_path_factory.mktemp("genai")
    paths = {}
    for name, dtype, symmetric in (
        ("fp16", "fp16", True),
        ("int4", "int4", True),
        ("int4-zp", "int4", False),
    ):
        path = root / name / "model.onnx"
        build_genai_decoder("tiny", seed=2, dtype=dtype, out_path=path, symmetric=symmetric)
        paths[name] = path
    return paths


def _contrib_ops() -> set[tuple[str, str]]:
    """Every op with a CPU kernel outside the standard domains onnx's inference knows."""
    lib = KernelLibrary.from_package("onnxep.providers.ops")
    lib += KernelLibrary.from_package("onnxep.providers_cpu.ops")
    import onnx.defs

    ops = set()
    for domain, op in lib.op_types():
        if domain in ("com.microsoft", "onnxep"):
            ops.add((domain, op))
        elif domain == "" and not onnx.defs.has(op, ""):
            ops.add((domain, op))  # e.g. genai's SimplifiedLayerNormalization
    return ops


def test_every_contrib_op_with_a_cpu_kernel_has_a_dtype_rule_or_a_reason():
    missing = sorted(op for op in _contrib_ops() if op not in RULES and op not in UNTYPED)
    assert not missing, f"no dtype rule and no reason to stay untyped: {missing}"
    assert all(UNTYPED.values())


def _norm_then_mlp(dtype: int) -> onnxep.InferenceSession:
    """SkipSimplifiedLayerNormalization, then x * Sigmoid(x): nothing declared after the norm."""
    nodes = [
        helper.make_node(
            "SkipSimplifiedLayerNormalization",
            ["x", "skip", "gamma"],
            ["h", "mean", "inv", "sum"],
            domain="com.microsoft",
        ),
        helper.make_node("Sigmoid", ["h"], ["s"]),
        helper.make_node("Mul", ["h", "s"], ["y"]),
    ]
    np_dt = np.float16 if dtype == TensorProto.FLOAT16 else np.float32
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, dtype, [2, 8]) for n in ("x", "skip")],
        [helper.make_tensor_value_info(n, 0, None) for n in ("y", "inv", "sum")],
        [helper.make_tensor("gamma", dtype, [8], np.ones(8, np_dt).tobytes(), raw=True)],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def test_rules_type_the_contrib_outputs_and_onnx_types_what_follows():
    model = ir.from_proto(_norm_then_mlp(TensorProto.FLOAT16))
    assert PropagateContribDtypes()(model).modified
    values = {v.name: v for n in model.graph for v in n.outputs}
    assert values["h"].dtype == values["sum"].dtype == ir.DataType.FLOAT16
    assert values["mean"].dtype == values["inv"].dtype == ir.DataType.FLOAT  # statistics
    assert values["s"].dtype == values["y"].dtype == ir.DataType.FLOAT16  # onnx's inference
    assert list(values["y"].shape) == [2, 8]
    assert not PropagateContribDtypes()(model).modified  # nothing left to type


def test_a_value_no_rule_can_type_stays_untyped():
    model = _norm_then_mlp(TensorProto.FLOAT)
    model.graph.node[0].domain = "example.custom"  # no rule, no schema
    model.opset_import.append(helper.make_opsetid("example.custom", 1))
    ir_model = ir.from_proto(model)
    PropagateContribDtypes()(ir_model)
    unknown = (None, ir.DataType.UNDEFINED)  # UNDEFINED: declared with elem_type 0
    assert all(v.dtype in unknown for n in ir_model.graph for v in n.outputs)


def test_propagation_lets_silu_fire_and_switched_off_it_does_not(make):
    proto = _norm_then_mlp(TensorProto.FLOAT)
    on = session(proto.SerializeToString(), make)
    assert fusion(on, "fuse_silu").fired == 1
    off = session(proto.SerializeToString(), make, off=["propagate_contrib_dtypes"])
    rep = fusion(off, "fuse_silu")
    assert rep.fired == 0
    assert "dtype an unknown dtype is not a float type" in rep.refused
    feeds = {n: np.random.default_rng(1).standard_normal((2, 8), np.float32) for n in ("x", "skip")}
    for a, b in zip(on.run(None, feeds), off.run(None, feeds)):
        np.testing.assert_array_equal(a, b)


def _greedy(path: Path, provider: str, off=()) -> list[int]:
    sess = session(str(path), provider, off=off)
    return onnxep.generate(sess, PROMPT, STEPS, progress=False).tokens


def _fires_and_decodes_as_unfused(path: Path, make, expected: dict[str, int]) -> None:
    fused = session(str(path), make)
    for name, count in expected.items():
        assert fusion(fused, name).fired == count, fused.placement().format(max_nodes=0)
    ops = {(n.domain, n.op_type) for n in fused.placement()}
    # SwiGLU fired; where its gate and up are one product it then went into that product's
    # epilogue (over a constant fp16/fp32 weight fuse_transposed_weights, over MatMulNBits
    # fuse_quantized_swiglu), and the norm before it into the product (fuse_norm_matmul)
    assert fusion(fused, "fuse_swiglu").fired > 0 and ("", "Sigmoid") not in ops
    gemvs = {("onnxep", op) for op in ("MatMulNT", "NormMatMulNT", "NormMatMulNBits")}
    assert ("onnxep", "SwiGLU") in ops or gemvs & ops
    reference = _greedy(path, "cpu", off=ALL)
    assert onnxep.generate(fused, PROMPT, STEPS, progress=False).tokens == reference


@pytest.mark.parametrize("name", ["fp16", "int4", "int4-zp"])
def test_factory_genai_decoders_fuse_their_mlps(factory, make, name):
    _fires_and_decodes_as_unfused(factory[name], make, MLP)


#: The checked-in decoders compute logits from layer 0 (layer 1 is dead and removed): one
#: MLP, whose gate and up join the lm_head (three readers of one norm) and are split again.
CHECKED_IN = {"fuse_silu": 1, "fuse_swiglu": 1, "fuse_shared_input_matmuls": 1}


@pytest.mark.parametrize("name", ["qwen2_fp32", "qwen2_int4"])
def test_checked_in_genai_decoders_fuse_their_mlps(make, name):
    _fires_and_decodes_as_unfused(GENAI / name / "model.onnx", make, CHECKED_IN)


def test_joined_matmul_nbits_reads_the_concatenated_tables(factory, make):
    # the join as it leaves it (the later passes fold the SwiGLU and the norm into it)
    fused = session(
        str(factory["int4-zp"]), make, off=("fuse_quantized_swiglu", "fuse_norm_matmul")
    )
    nbits = [n for n in fused.compiled.model.graph if n.op_type == "MatMulNBits"]
    joined = [n for n in nbits if "joined" in (n.name or "")]
    assert len(joined) == 2
    for n in joined:
        (consumer,) = [u.node for u in n.outputs[0].uses()]
        assert consumer.op_type == "SwiGLU"
        assert n.inputs[3] is not None  # the zero points were joined too
        rows = n.attributes["N"].value
        assert n.inputs[1].const_value.shape[0] == rows


# -- MatMulNBits siblings on small graphs ---------------------------------------------------

K, BLOCK = 64, 32


def nbits_tables(rng, n, zp_kind, dtype=np.float32, bits=4, block=BLOCK, flat=False, k=None):
    """B, scales and zero points of an N x K weight (``k``, default K) as onnxruntime's
    quantizer lays them out."""
    kb = -(-(K if k is None else k) // block)
    b = rng.integers(0, 256, (n, kb, block * bits // 8), dtype=np.uint8)
    scales = (rng.random((n, kb)) * 0.1 + 0.01).astype(dtype)
    zp = None
    if zp_kind == "packed":
        zp = rng.integers(0, 256, (n, -(-kb * bits // 8)), dtype=np.uint8)
    elif zp_kind == "float":
        zp = (rng.random((n, kb)) * (1 << bits)).astype(dtype)
    if flat:
        scales = scales.reshape(-1)
        zp = None if zp is None else zp.reshape(-1)
    return b, scales, zp


def nbits_siblings(
    sizes=(24, 40), zp_kind="packed", bias=False, flat=False, blocks=None, g_idx=False
):
    """MatMulNBits nodes reading one A, each output a graph output."""
    rng = np.random.default_rng(11)
    nodes, inits, outs = [], [], []
    for j, n in enumerate(sizes):
        block = blocks[j] if blocks else BLOCK
        b, scales, zp = nbits_tables(rng, n, zp_kind, block=block, flat=flat)
        names = [f"b{j}", f"s{j}", f"z{j}" if zp is not None else "", "", ""]
        inits += [numpy_helper.from_array(b, f"b{j}"), numpy_helper.from_array(scales, f"s{j}")]
        if zp is not None:
            inits.append(numpy_helper.from_array(zp, f"z{j}"))
        if g_idx:
            names[3] = f"g{j}"
            gi = (np.arange(K) // block).astype(np.int32)
            inits.append(numpy_helper.from_array(gi, f"g{j}"))
        if bias:
            names[4] = f"bias{j}"
            inits.append(
                numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), f"bias{j}")
            )
        while names[-1] == "":
            names.pop()
        attrs = {"K": K, "N": n, "bits": 4, "block_size": block}
        nodes.append(
            helper.make_node(
                "MatMulNBits", ["a", *names], [f"y{j}"], domain="com.microsoft", **attrs
            )
        )
        outs.append(helper.make_tensor_value_info(f"y{j}", TensorProto.FLOAT, [3, n]))
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [3, K])], outs, inits
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


@pytest.mark.parametrize(
    "zp_kind, bias, flat",
    [
        ("none", False, False),
        ("packed", True, False),
        ("float", False, True),
        ("packed", False, True),
    ],
)
def test_matmul_nbits_siblings_join_and_split_as_before(make, zp_kind, bias, flat):
    model = nbits_siblings(zp_kind=zp_kind, bias=bias, flat=flat)
    fused, plain = session(model, make), session(model, make, off=ALL)
    rep = fusion(fused, "fuse_shared_input_matmuls")
    assert rep.by_rule == {"joined_and_split": 1}, fused.placement().format(max_nodes=0)
    assert [n.op_type for n in fused.placement()] == ["MatMulNBits", "Split"]
    a = {"a": np.random.default_rng(2).standard_normal((3, K)).astype(np.float32)}
    for got, want in zip(fused.run(None, a), plain.run(None, a)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "kw, reason",
    [
        (dict(g_idx=True), "a MatMulNBits with g_idx (its quantization groups are reordered)"),
        (dict(blocks=(32, 16)), MIXED_NBITS),
    ],
)
def test_matmul_nbits_siblings_that_differ_are_refused(make, kw, reason):
    sess = session(nbits_siblings(**kw), make)
    rep = fusion(sess, "fuse_shared_input_matmuls")
    assert rep.fired == 0 and reason in rep.refused
