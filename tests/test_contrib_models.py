"""The com.microsoft corpus: the project's models through onnxruntime's own tools, run by onnxep.

Built here, in the test run, from tests/data's exported models and a small BERT-style
encoder (bench/factory): onnxruntime.quantization's quantize_dynamic (QOperator, per tensor
and per channel), quantize_static (QDQ and QOperator, uint8 and int8 activations),
onnxruntime.transformers.optimizer (bert and gpt2 model types, then quantize_dynamic as
onnxruntime's BERT recipe does), and onnxruntime's own graph optimizer at the extended
level saved to a file (the fused FusedConv, FusedMatMul, QLinear*, QGemm,
DynamicQuantizeMatMul, MatMulIntegerToFloat ... it writes). Every model must load in
onnxep's CPU provider with no node declined and match onnxruntime's CPU provider run on
the same model with its optimizations off.

Marked ``contribmodels``; part of the default run.
"""

from __future__ import annotations

import collections
import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import EXPORTED_DIMS, exported_feeds

import onnxep

ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")
import ort_int8_reference  # noqa: E402 - after onnxruntime is known to be there

pytestmark = pytest.mark.contribmodels

DATA = Path(__file__).resolve().parent / "data"
SOURCES = ["resnet_cnn", "hf_llama", "hf_llama_kv", "llama_kv", "llama_kv_opset23", "bert"]
SOURCES += ["bert_ts", "lstm_ts"]
BERT_SIZE = {"vocab": 256, "hidden": 64, "layers": 2, "heads": 2, "inter": 128, "max_positions": 64}
BERT_DIMS = {"batch": 2, "sequence": 8}
DIMS = {**{k[:-5]: v for k, v in EXPORTED_DIMS.items()}, "bert": BERT_DIMS, "bert_ts": BERT_DIMS}
DIMS["lstm_ts"] = {"sequence": 6, "batch": 3}
VOCAB = {"bert": 256, "bert_ts": 256}


def feeds_for(path: Path, source: str, seed: int = 0) -> dict:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return exported_feeds(sess, DIMS[source], np.random.default_rng(seed), VOCAB.get(source, 512))


class Calibration(quantization.CalibrationDataReader):
    def __init__(self, path: Path, source: str) -> None:
        self.items = iter([feeds_for(path, source, seed) for seed in (1, 2, 3)])

    def get_next(self):
        return next(self.items, None)


def _static(fmt: str, act: str, weight: str = "QInt8", contrib: bool = False):
    def make(src: Path, dst: Path, source: str) -> None:
        quantization.quantize_static(
            str(src),
            str(dst),
            Calibration(src, source),
            quant_format=getattr(quantization.QuantFormat, fmt),
            activation_type=getattr(quantization.QuantType, act),
            weight_type=getattr(quantization.QuantType, weight),
            extra_options={"UseQDQContribOps": contrib},
        )

    return make


def _dynamic(per_channel: bool):
    def make(src: Path, dst: Path, source: str) -> None:
        quantization.quantize_dynamic(str(src), str(dst), per_channel=per_channel)

    return make


def _optimize(model_type: str, then_quantize: bool = False):
    def make(src: Path, dst: Path, source: str) -> None:
        from onnxruntime.transformers import optimizer

        heads = {"num_heads": BERT_SIZE["heads"], "hidden_size": BERT_SIZE["hidden"]}
        bert = source.startswith("bert")
        opt = optimizer.optimize_model(
            str(src), model_type=model_type, opt_level=0, **(heads if bert else {})
        )
        opt.save_model_to_file(str(dst))
        if then_quantize:
            # the contrib ops' outputs have no inferred type: tell the quantizer it is float
            extra = {"DefaultTensorType": onnx.TensorProto.FLOAT}
            quantization.quantize_dynamic(str(dst), str(dst), extra_options=extra)

    return make


#: tool name -> how it makes a model from a source; each source goes through each tool.
TOOLS = {
    "dynamic": _dynamic(False),
    "dynamic_per_channel": _dynamic(True),
    "static_qdq_u8": _static("QDQ", "QUInt8"),
    "static_qop_u8": _static("QOperator", "QUInt8"),
    "static_qdq_s8": _static("QDQ", "QInt8"),
    "static_qop_s8": _static("QOperator", "QInt8"),
    "static_qdq_u16_contrib": _static("QDQ", "QUInt16", "QInt8", contrib=True),
    "optimizer_bert": _optimize("bert"),
    "optimizer_gpt2": _optimize("gpt2"),
    "optimizer_bert_dynamic": _optimize("bert", then_quantize=True),
}
FLOAT_TOOLS = ("float", "optimizer_bert", "optimizer_gpt2")
#: models onnxruntime's extended graph optimizer rewrites and saves (its own contrib ops)
ORT_SAVED = ["float", "dynamic", "static_qdq_u8", "static_qdq_s8", "static_qop_u8"]

#: (source, variant) pairs onnxruntime itself cannot load, and why
ORT_FAILS = {
    # quantize_dynamic turns the ONNX-domain Attention (opset 23) into QAttention, whose
    # schema onnxruntime then rejects
    ("llama_kv_opset23", "dynamic"): "QAttention made from ONNX Attention",
    ("llama_kv_opset23", "dynamic_per_channel"): "QAttention made from ONNX Attention",
    ("llama_kv_opset23", "optimizer_bert_dynamic"): "QAttention made from ONNX Attention",
    # onnxruntime's own extended optimizer writes a QuantizeLinear it then cannot type
    ("llama_kv_opset23", "static_qop_s8.ort_extended"): "QuantizeLinear output_dtype mismatch",
}
#: pairs whose numbers are not defined: int8 calibration gives the causal mask's -inf fill
#: an infinite scale, so QLinearSoftmax reads exp(NaN) rows, where onnxruntime's result
#: comes from float-to-int casts of NaN (undefined in C++)
UNDEFINED = {
    ("llama_kv", "static_qop_s8"): "infinite masked_fill scale: softmax of NaN",
    ("llama_kv_opset23", "static_qop_s8"): "infinite masked_fill scale: softmax of NaN",
}


def export_bert_pair(dynamo_path: Path, torchscript_path: Path) -> None:
    """The BERT-style encoder through both torch exporters: the TorchScript one's graph is the
    one onnxruntime.transformers.optimizer fuses into com.microsoft Attention."""
    import torch

    from bench.factory.torch_models import BertEncoder, export_bert

    export_bert(dynamo_path, **BERT_SIZE)
    torch.manual_seed(0)
    model = BertEncoder(**BERT_SIZE).eval()
    ids = torch.randint(0, BERT_SIZE["vocab"], (2, 8))
    ones = torch.ones(2, 8, dtype=torch.int64)
    names = ["input_ids", "attention_mask", "token_type_ids"]
    torch.onnx.export(
        model,
        (ids, ones, ones * 0),
        str(torchscript_path),
        dynamo=False,
        opset_version=17,
        input_names=names,
        output_names=["last_hidden_state"],
        dynamic_axes={n: {0: "batch", 1: "sequence"} for n in names},
    )


def export_lstm(path: Path) -> None:
    """A bidirectional LSTM tagger through the TorchScript exporter, which writes ONNX LSTM
    (quantize_dynamic makes it DynamicQuantizeLSTM)."""
    import torch

    class Tagger(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = torch.nn.LSTM(8, 16, bidirectional=True)
            self.head = torch.nn.Linear(32, 5)

        def forward(self, x):
            return self.head(self.lstm(x)[0])

    torch.manual_seed(0)
    names = {"features": {0: "sequence", 1: "batch"}}
    torch.onnx.export(
        Tagger().eval(),
        (torch.randn(6, 3, 8),),
        str(path),
        dynamo=False,
        opset_version=17,
        input_names=["features"],
        output_names=["tags"],
        dynamic_axes=names,
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """{(source, variant): path} for every model onnxruntime itself can load."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer's advice on preprocessing
    try:
        return _corpus(tmp_path_factory)
    finally:
        root.setLevel(level)  # later tests read warnings (caplog)


def _corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("contrib_corpus")
    made = ("bert", "bert_ts", "lstm_ts")
    sources = {s: (out if s in made else DATA) / f"{s}.onnx" for s in SOURCES}
    export_bert_pair(sources["bert"], sources["bert_ts"])
    export_lstm(sources["lstm_ts"])
    models = {}
    for source, src in sources.items():
        models[(source, "float")] = src
        for tool, make in TOOLS.items():
            if (source, tool) in ORT_FAILS:
                continue
            dst = out / f"{source}.{tool}.onnx"
            make(src, dst, source)
            models[(source, tool)] = dst
    for (source, tool), path in list(models.items()):
        if tool not in ORT_SAVED or (source, f"{tool}.ort_extended") in ORT_FAILS:
            continue
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        dst = out / f"{source}.{tool}.ort_extended.onnx"
        so.optimized_model_filepath = str(dst)
        ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        models[(source, f"{tool}.ort_extended")] = dst
    return models


def contrib_ops(path: Path) -> collections.Counter:
    model = onnx.load(str(path), load_external_data=False)
    return collections.Counter(n.op_type for n in model.graph.node if n.domain == "com.microsoft")


def _run_ort(path: Path, feeds: dict) -> list:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # one thread: its DynamicQuantizeLSTM quantizes the hidden state per chunk of batch
    # rows, one chunk per thread, so its numbers depend on the machine's core count
    so.intra_op_num_threads = 1
    # onnxruntime's uint8 x int8 products saturate on x86 CPUs without VNNI: exact references
    model, ref_feeds = ort_int8_reference.reference(onnx.load(str(path)), feeds)
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, ref_feeds)


def assert_matches(got: list, ref: list, quantized: bool) -> None:
    """Float models to float rounding; quantized ones to a few quantization steps.

    In a quantized model a float op that differs in its last bit can move a value across
    a rounding boundary of the next QuantizeLinear: one step of that tensor's scale, which
    later layers carry on. So quantized outputs are held to 5% of their range elementwise
    and, on average, to 0.5%.
    """
    for g, r in zip(got, ref):
        g, r = np.asarray(g), np.asarray(r)
        assert g.shape == r.shape and g.dtype == r.dtype
        if not quantized:
            np.testing.assert_allclose(g, r, atol=2e-4, rtol=2e-3)
            continue
        span = float(np.abs(r).max()) or 1.0
        err = np.abs(g.astype(np.float64) - r.astype(np.float64))
        assert err.max() <= 0.05 * span, f"max error {err.max()} of range {span}"
        assert err.mean() <= 0.005 * span, f"mean error {err.mean()} of range {span}"


CASES = [(s, t) for s in SOURCES for t in ["float", *TOOLS]] + [
    (s, f"{t}.ort_extended") for s in SOURCES for t in ORT_SAVED
]


def _marks(case):
    for key in (case, (case[0], case[1].split(".")[0])):
        if key in ORT_FAILS:
            return [pytest.mark.skip(reason=f"onnxruntime cannot load it: {ORT_FAILS[key]}")]
    if case in UNDEFINED:
        return [pytest.mark.skip(reason=f"results undefined: {UNDEFINED[case]}")]
    return []


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=_marks(c), id=f"{c[0]}-{c[1]}") for c in CASES]
)
def test_corpus_model_matches_onnxruntime(corpus, case):
    path = corpus[case]
    feeds = feeds_for(path, case[0], seed=7)
    sess = onnxep.InferenceSession(str(path), providers=["cpu"])
    got = sess.run(None, feeds)
    base = case[1].split(".")[0]
    assert_matches(got, _run_ort(path, feeds), base not in FLOAT_TOOLS)


def test_corpus_covers_the_contrib_ops(corpus):
    """The tools emitted what this corpus is for; a tool change that drops an op shows here."""
    seen = collections.Counter()
    for path in corpus.values():
        seen.update(contrib_ops(path))
    expected = {
        "QLinearAdd", "QLinearMul", "QLinearConcat", "QLinearSigmoid", "QLinearSoftmax",
        "QLinearWhere", "QGemm", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
        "EmbedLayerNormalization", "QEmbedLayerNormalization", "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization", "BiasGelu", "FusedMatMul", "FusedConv", "QuickGelu",
        "QuantizeLinear", "DequantizeLinear", "Attention", "QAttention", "DynamicQuantizeLSTM",
    }  # fmt: skip
    assert expected <= set(seen), sorted(expected - set(seen))
