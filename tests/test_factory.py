"""The benchmark model factory (bench/factory) and the torch peer that mirrors its models.

Factory decoders must be the builder's graphs (checked against a real
onnxruntime-genai export of the same weights, where the builder is
installed), must run in onnxruntime and onnxep alike, and the torch peer must
compute what onnxruntime computes.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench/ is imported from the repo root, not installed

from bench.factory import (  # noqa: E402
    HYBRID_SIZES,
    SIZES,
    build_genai_decoder,
    build_hybrid_decoder,
)
from bench.factory.quant import dequantize_nbits, quantize_nbits  # noqa: E402

ort = pytest.importorskip("onnxruntime")

import onnxep  # noqa: E402

HAVE_BUILDER = all(importlib.util.find_spec(m) for m in ("onnxruntime_genai", "transformers"))
needs_builder = pytest.mark.skipif(
    not HAVE_BUILDER, reason="needs onnxruntime-genai and transformers (pip install -e .[export])"
)


def close(a, b) -> bool:
    """The agreement asked of two runtimes on the same model: 1e-5 + 1e-4 * |b|."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and bool(np.all(np.abs(a - b) <= 1e-5 + 1e-4 * np.abs(b)))


# -- driving a decoder: prefill, then one decode step with every state fed back -------------


def first_feeds(inputs, ids: np.ndarray, positions_3d: bool = False) -> dict:
    """Prompt feeds: ids, an all-ones mask, positions, and empty (or zero) states."""
    b, s = ids.shape
    feeds = {"input_ids": ids, "attention_mask": np.ones((b, s), np.int64)}
    for arg in inputs:
        if arg.name == "position_ids":
            pos = np.arange(s, dtype=np.int64)[None].repeat(b, 0)
            feeds[arg.name] = np.stack([pos] * 3) if positions_3d else pos
        elif arg.name not in feeds:
            shape = [
                b if i == 0 else (d if isinstance(d, int) else 0) for i, d in enumerate(arg.shape)
            ]
            dtype = np.float16 if arg.type == "tensor(float16)" else np.float32
            feeds[arg.name] = np.zeros(shape, dtype)
    return feeds


def next_feeds(prev: dict, names: list[str], outputs: list, positions_3d: bool = False) -> dict:
    """The decode step after ``prev``: the greedy token, a longer mask, presents as pasts."""
    out = dict(zip(names, outputs))
    ids = np.asarray(out["logits"])[:, -1:].argmax(-1).astype(np.int64)
    b, total = prev["attention_mask"].shape
    feeds = {"input_ids": ids, "attention_mask": np.ones((b, total + 1), np.int64)}
    if "position_ids" in prev:
        pos = np.full((b, 1), total, np.int64)
        feeds["position_ids"] = np.stack([pos] * 3) if positions_3d else pos
    for name in prev:
        if name.startswith("past"):
            present = name.replace("past_key_values", "present").replace("past.", "present.")
            feeds[name] = np.asarray(out[present])
    return feeds


def two_steps(run, inputs, names, positions_3d=False, batch=2, seq=6, seed=0):
    """[(feeds, outputs)] for a prefill and one decode step, driven by ``run``."""
    ids = np.random.default_rng(seed).integers(0, 500, (batch, seq)).astype(np.int64)
    feeds = first_feeds(inputs, ids, positions_3d)
    steps = []
    for _ in range(2):
        outs = [np.asarray(o) for o in run(feeds)]
        steps.append((feeds, outs))
        feeds = next_feeds(feeds, names, outs, positions_3d)
    return steps


def ort_session(path: Path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / "model.onnx"
    build_genai_decoder("tiny", out_path=path, seed=1)
    return path


# -- the genai decoder --------------------------------------------------------------------


def test_metadata_records_the_architecture(tiny):
    meta = {p.key: p.value for p in onnx.load(str(tiny), load_external_data=False).metadata_props}
    assert meta["onnxep.factory"] == "genai-decoder"
    conf = json.loads(meta["onnxep.config"])
    want = SIZES["tiny"]
    for key in ("hidden", "layers", "heads", "kv_heads", "head_dim", "intermediate", "vocab"):
        assert conf[key] == getattr(want, key)
    for key in ("rope_theta", "eps", "dtype", "bits", "block_size", "max_length"):
        assert key in conf


def test_weights_are_written_as_external_data(tiny):
    proto = onnx.load(str(tiny), load_external_data=False)
    big = [t for t in proto.graph.initializer if np.prod(t.dims) * 4 >= 4096]
    assert big and all(t.data_location == onnx.TensorProto.EXTERNAL for t in big)
    assert (tiny.parent / "model.onnx.data").stat().st_size > 0
    assert build_genai_decoder("tiny").graph.initializer[0].HasField("raw_data")  # in memory


def test_graph_has_the_builder_op_pattern(tiny):
    proto = onnx.load(str(tiny), load_external_data=False)
    ops = [(n.domain or "", n.op_type) for n in proto.graph.node]
    assert ops.count(("", "SimplifiedLayerNormalization")) == 1
    assert ops.count(("com.microsoft", "SkipSimplifiedLayerNormalization")) == 2 * 2
    assert ops.count(("com.microsoft", "GroupQueryAttention")) == 2
    gqa = next(n for n in proto.graph.node if n.op_type == "GroupQueryAttention")
    attrs = {a.name: helper.get_attribute_value(a) for a in gqa.attribute}
    assert attrs["do_rotary"] == 1 and gqa.input[7:9] == ["cos_cache", "sin_cache"]
    names = [i.name for i in proto.graph.input]
    assert names[:4] == [
        "input_ids",
        "attention_mask",
        "past_key_values.0.key",
        "past_key_values.1.key",
    ]


def test_qkv_bias_add_only_when_the_bias_is_nonzero(monkeypatch):
    from bench.factory.weights import WeightSource

    cfg = SIZES["tiny"].replace(attention_bias=True)
    assert sum(n.op_type == "Add" for n in build_genai_decoder(cfg).graph.node) == cfg.layers
    draw = WeightSource.get

    def zero_biases(self, name, shape, kind="linear"):
        return (
            np.zeros(shape, np.float32) if name.endswith("bias") else draw(self, name, shape, kind)
        )

    monkeypatch.setattr(WeightSource, "get", zero_biases)
    assert not any(n.op_type == "Add" for n in build_genai_decoder(cfg).graph.node)


def _exact_nbits(path: Path) -> None:
    """accuracy_level 0: onnxruntime multiplies by the dequantized weights, as torch does."""
    proto = onnx.load(str(path))
    for node in proto.graph.node:
        for a in node.attribute:
            if a.name == "accuracy_level":
                a.i = 0
    onnx.save(proto, str(path))


def build_variant(path: Path, variant: str, seed: int = 0) -> str:
    """The tiny decoder as ``[tied-]DTYPE[-exact]``; returns the dtype.

    ``tied``: embeddings shared with the LM head (Qwen2.5's setting). ``exact``:
    MatMulNBits at accuracy_level 0, so onnxruntime multiplies by the
    dequantized weights instead of rounding activations to int8.
    """
    parts = variant.split("-")
    dtype = next(p for p in parts if p not in ("tied", "exact"))
    cfg = SIZES["tiny"].replace(tie_embeddings="tied" in parts)
    build_genai_decoder(cfg, dtype=dtype, out_path=path, seed=seed)
    if "exact" in parts:
        _exact_nbits(path)
    return dtype


def assert_agrees_under_int8_rounding(got, level4, level0) -> None:
    """``got`` agrees with onnxruntime's accuracy_level-4 result as that level allows.

    At accuracy_level 4 MatMulNBits rounds its activations to int8 per block. Two runtimes
    round the same activations the same way, except where a last-bit difference upstream (a
    norm summed in another order) lands an activation on a rounding boundary: that one flip
    moves every value downstream of it, by at most what the rounding itself moves them. So
    the bound is the rounding's whole effect, measured as the distance between onnxruntime's
    level-4 and level-0 (exact dequantized product) results on the same weights; and more
    values must agree tightly with level 4 than with level 0, or ``got`` did not round.
    """
    got, level4, level0 = (np.asarray(v, np.float32) for v in (got, level4, level0))
    assert got.shape == level4.shape
    tight = 1e-5 + 1e-4 * np.abs(level4)
    effect = float(np.abs(level4 - level0).max())
    worst = float(np.abs(got - level4).max())
    assert worst <= effect + tight.max(), (worst, effect)
    rounded = int(np.sum(np.abs(got - level4) <= tight))
    exact = int(np.sum(np.abs(got - level0) <= tight))
    assert rounded > exact, (rounded, exact)


@pytest.mark.parametrize(
    "variant", ["fp32", "fp16", "int4", "int8", "int8-exact", "tied-fp32", "tied-int4"]
)
def test_tiny_runs_in_onnxruntime_and_onnxep(tmp_path, variant):
    path = tmp_path / "model.onnx"
    dtype = build_variant(path, variant)
    ref = ort_session(path)
    level0 = None
    if dtype in ("int4", "int8") and "exact" not in variant:
        exact = tmp_path / "exact.onnx"
        build_variant(exact, f"{variant}-exact")
        level0 = ort_session(exact)
    ours = onnxep.InferenceSession(str(path), providers=["cpu"])
    names = [o.name for o in ref.get_outputs()]
    assert [o.name for o in ours.get_outputs()] == names
    for feeds, expected in two_steps(lambda f: ref.run(None, f), ref.get_inputs(), names):
        got = ours.run(None, feeds)
        if dtype == "fp16":
            assert np.allclose(np.float32(got[0]), np.float32(expected[0]), atol=2e-3)
        elif level0 is not None:
            for g, e, x in zip(got, expected, level0.run(None, feeds)):
                assert_agrees_under_int8_rounding(g, e, x)
        else:
            assert all(close(g, e) for g, e in zip(got, expected)), variant


def test_quantization_matches_onnxruntime():
    pybind = pytest.importorskip("onnxruntime.capi._pybind_state")
    if not hasattr(pybind, "quantize_matmul_4bits"):
        pytest.skip("this onnxruntime has no quantize_matmul_4bits")
    rng = np.random.default_rng(0)
    for k, n in ((64, 5), (96, 3), (128, 16)):
        w = (rng.standard_normal((k, n)) * rng.choice([0.02, 1.0])).astype(np.float32)
        for bits in (4, 8):
            fn = getattr(pybind, f"quantize_matmul_{bits}bits")
            for sym in (True, False):
                kpack, blocks = 8 // bits, k // 32
                packed = np.zeros((n, blocks, 32 // kpack), np.uint8)
                zp = np.zeros((n, -(-blocks // kpack)), np.uint8)
                scales = np.zeros((n, blocks), np.float32)
                fn(packed, w, scales, zp, 32, n, k, sym)
                ours = quantize_nbits(w, bits, 32, sym)
                assert np.array_equal(ours.packed, packed)
                assert np.array_equal(ours.scales, scales)
                if not sym:
                    assert np.array_equal(ours.zero_points, zp)
                back = dequantize_nbits(ours.packed, ours.scales, ours.zero_points, k, bits, 32)
                assert np.abs(back - w).max() <= np.abs(scales).max() * 1.001


# -- the torch peer ------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["fp32", "fp16", "int4-exact", "tied-fp32", "tied-int4-exact"])
def test_torch_peer_matches_onnxruntime(tmp_path, variant):
    pytest.importorskip("torch")
    from onnxep.benchmark.sides import to_numpy
    from onnxep.benchmark.torch_peer import load_torch_peer

    path = tmp_path / "model.onnx"
    dtype = build_variant(path, variant, seed=2)
    ref, peer = ort_session(path), load_torch_peer(str(path))
    names = [o.name for o in ref.get_outputs()]
    for feeds, expected in two_steps(lambda f: ref.run(None, f), ref.get_inputs(), names):
        got = to_numpy(peer.run(feeds))
        assert [g.dtype for g in got] == [e.dtype for e in expected]
        if dtype == "fp16":
            assert all(
                np.allclose(np.float32(g), np.float32(e), atol=5e-3) for g, e in zip(got, expected)
            )
        else:
            assert all(close(g, e) for g, e in zip(got, expected))


def test_torch_peer_refuses_models_the_factory_did_not_make(tmp_path):
    from onnxep.benchmark.torch_peer import load_torch_peer

    proto = build_genai_decoder("tiny")
    del proto.metadata_props[:]
    onnx.save(proto, str(tmp_path / "m.onnx"))
    with pytest.raises(ValueError, match="not made by onnxep's model factory"):
        load_torch_peer(str(tmp_path / "m.onnx"))


@pytest.mark.parametrize("kind", ["genai", "hybrid"])
def test_bench_decodes_against_onnxruntime_and_torch(tmp_path, kind):
    pytest.importorskip("torch")
    from onnxep.benchmark import bench

    path = tmp_path / "model.onnx"
    build = build_genai_decoder if kind == "genai" else build_hybrid_decoder
    build("tiny", out_path=path)
    res = bench(
        str(path), vs=["onnxruntime", "torch"], decode=4, context=8, warmup=1, progress=False
    )
    assert res.skipped == {}
    assert set(res.summary) == {"onnxep", "onnxruntime", "torch"}
    assert len({tuple(t) for t in res.tokens.values()}) == 1, res.tokens


# -- hybrid decoders ---------------------------------------------------------------------


@pytest.mark.parametrize("positions", ["2d", "3d"])
def test_hybrid_runs_in_onnxruntime_with_states_fed_back(tmp_path, positions):
    path = tmp_path / "model.onnx"
    build_hybrid_decoder("tiny", out_path=path, positions=positions)
    sess = ort_session(path)
    names = [o.name for o in sess.get_outputs()]
    cfg = HYBRID_SIZES["tiny"]
    linear = [i for i, t in enumerate(cfg.layer_types) if t == "linear_attention"]
    assert {f"present.{i}.{s}" for i in linear for s in ("conv", "recurrent")} <= set(names)
    ops = {n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node}
    assert {"CausalConvWithState", "LinearAttentionGate", "LinearAttention", "GatedRMSNorm"} <= ops
    steps = two_steps(lambda f: sess.run(None, f), sess.get_inputs(), names, positions == "3d")
    (_, prefill), (decode_feeds, decode) = steps
    assert decode[0].shape == (2, 1, cfg.vocab) and np.isfinite(decode[0]).all()
    # the decode step continued from the prefill's states: rerunning from zero states differs
    fresh = dict(decode_feeds)
    for name in fresh:
        if name.startswith("past."):
            fresh[name] = np.zeros_like(fresh[name])
    assert not np.allclose(sess.run(None, fresh)[0], decode[0])


def test_hybrid_in_onnxep_and_torch_peer_match_onnxruntime(tmp_path):
    pytest.importorskip("torch")
    from onnxep.benchmark.sides import to_numpy
    from onnxep.benchmark.torch_peer import load_torch_peer

    path = tmp_path / "model.onnx"
    build_hybrid_decoder("tiny", out_path=path, seed=3)
    ref = ort_session(path)
    ours = onnxep.InferenceSession(str(path), providers=["cpu"])
    peer = load_torch_peer(str(path))
    names = [o.name for o in ref.get_outputs()]
    for feeds, expected in two_steps(lambda f: ref.run(None, f), ref.get_inputs(), names):
        got = ours.run(None, feeds)
        assert all(np.allclose(g, e, rtol=1e-4, atol=1e-5) for g, e in zip(got, expected))
        got = to_numpy(peer.run(feeds))
        assert all(np.allclose(g, e, rtol=1e-4, atol=1e-5) for g, e in zip(got, expected))


# -- against the real builder ---------------------------------------------------------------


def _builder(hf_dir: Path, out: Path, precision: str, *extra: str) -> Path:
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir)]
    cmd += ["-o", str(out), "-p", precision, "-e", "cpu", "-c", str(out.parent / "cache")]
    if extra:
        cmd += ["--extra_options", *extra]
    subprocess.run(cmd, check=True, capture_output=True)
    return out / "model.onnx"


def _node_signature(path: Path) -> list:
    proto = onnx.load(str(path), load_external_data=False)
    return [
        (n.domain, n.op_type, n.name, list(n.input), list(n.output))
        + (
            sorted(
                (a.name, str(helper.get_attribute_value(a))) for a in n.attribute if a.type != 4
            ),
        )
        for n in proto.graph.node
    ]


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def qwen2_hf(tmp_path_factory, request):
    """A random Qwen2ForCausalLM of the tiny size (biases nonzero), saved; and its weights."""
    import torch
    from transformers import Qwen2ForCausalLM

    from bench.factory.hf import qwen2_config, text_state_dict

    cfg = SIZES["tiny"].replace(attention_bias=True, tie_embeddings=request.param)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(qwen2_config(cfg)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.02)
            elif "norm" in name:
                p.normal_(1, 0.1)  # so a misplaced norm weight shows
    hf_dir = tmp_path_factory.mktemp("qwen2_hf")
    model.save_pretrained(hf_dir)
    return hf_dir, text_state_dict(model), cfg


def _same_as_builder(ours: Path, theirs: Path, positions_3d: bool = False) -> None:
    """Node for node the same graph, the same initializers, the same outputs in onnxruntime."""
    assert _node_signature(ours) == _node_signature(theirs)
    inits = [
        {t.name: numpy_helper.to_array(t) for t in onnx.load(str(p)).graph.initializer}
        for p in (ours, theirs)
    ]
    assert inits[0].keys() == inits[1].keys()
    for name, array in inits[0].items():  # bit for bit: weights, quantized blocks, rotary caches
        assert array.dtype == inits[1][name].dtype and np.array_equal(array, inits[1][name]), name
    a, b = ort_session(ours), ort_session(theirs)
    names = [o.name for o in b.get_outputs()]
    assert [i.name for i in a.get_inputs()] == [i.name for i in b.get_inputs()]
    assert [o.name for o in a.get_outputs()] == names
    # (the builder's cache head dim is symbolic: empty caches are shaped from ours)
    steps = two_steps(lambda f: b.run(None, f), a.get_inputs(), names, positions_3d, batch=1)
    for feeds, expected in steps:
        assert all(close(g, e) for g, e in zip(a.run(None, feeds), expected))


@needs_builder
@pytest.mark.parametrize("dtype", ["fp32", "int4", "int8", "int4-asymmetric"])
def test_genai_decoder_equals_the_builder_export(qwen2_hf, tmp_path, dtype):
    hf_dir, weights, cfg = qwen2_hf
    symmetric = not dtype.endswith("asymmetric")
    if not symmetric and cfg.tie_embeddings:
        pytest.skip("the builder's tied asymmetric int4 export references a missing weight")
    precision = dtype.split("-")[0]
    extra = () if symmetric else ("is_symmetric=false",)
    theirs = _builder(hf_dir, tmp_path / "builder", precision, *extra)
    ours = tmp_path / "factory" / "model.onnx"
    build_genai_decoder(cfg, weights=weights, dtype=precision, out_path=ours, symmetric=symmetric)
    _same_as_builder(ours, theirs)


@needs_builder
def test_hybrid_decoder_equals_the_builder_export(tmp_path):
    import torch
    from transformers import Qwen3_5ForConditionalGeneration

    from bench.factory.hf import qwen3_5_config, text_state_dict

    cfg = HYBRID_SIZES["tiny"]
    torch.manual_seed(0)
    model = Qwen3_5ForConditionalGeneration(qwen3_5_config(cfg)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and "linear_attn" not in name:
                p.normal_(0, 0.1)  # Qwen3.5's offset norms scale by 1 + weight
    model.save_pretrained(tmp_path / "hf")
    theirs = _builder(tmp_path / "hf", tmp_path / "builder", "fp32")
    ours = tmp_path / "factory" / "model.onnx"
    build_hybrid_decoder(cfg, weights=text_state_dict(model), out_path=ours, positions="3d")
    _same_as_builder(ours, theirs, positions_3d=True)


# -- the command line and the torch-exported models ----------------------------------------


def test_make_models_cli(tmp_path, capsys):
    from bench.make_models import main

    assert (
        main(["--size", "tiny", "--kind", "hybrid", "--dtype", "int4", "--out", str(tmp_path)]) == 0
    )
    path = tmp_path / "hybrid-tiny-int4" / "model.onnx"
    assert str(path) in capsys.readouterr().out
    assert "MatMulNBits" in {
        n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node
    }


def test_bert_export_matches_torch(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    from bench.factory.torch_models import BertEncoder, export_bert

    size = dict(vocab=256, hidden=64, layers=2, heads=2, inter=128, max_positions=64)
    path = tmp_path / "bert.onnx"
    export_bert(path, **size)
    torch.manual_seed(0)
    model = BertEncoder(**size).eval()
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 256, (3, 10)).astype(np.int64)
    mask = np.ones((3, 10), np.int64)
    mask[1, 7:] = 0
    types = np.zeros((3, 10), np.int64)
    with torch.no_grad():
        want = model(*(torch.from_numpy(a) for a in (ids, mask, types))).numpy()
    feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    for sess in (ort_session(path), onnxep.InferenceSession(str(path), providers=["cpu"])):
        assert np.allclose(sess.run(None, feeds)[0], want, atol=1e-4)
