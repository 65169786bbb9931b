"""onnxep ``["cpu"]`` against onnxruntime CPU on recurrent and opset-23 fused-op exports.

Usage: ``python bench/cpu_recurrent.py [--runs N] [--threads N] [--only NAME ...] [--json PATH]``

Every model is exported here by torch.onnx into a scratch folder: ``nn.LSTM``,
``nn.GRU`` and ``nn.RNN`` (TorchScript and dynamo exporters; uni- and
bidirectional, ``batch_first``, two layers) and the tiny LLaMA-style decoder of
``bench/factory/torch_models.py`` written with ``F.rms_norm`` and
``F.scaled_dot_product_attention`` at opset 23 (RMSNormalization, Attention),
plus a graph built by onnx.helper around ``RotaryEmbedding``, which no exporter
writes yet. Each model runs onnxep and onnxruntime interleaved on the same
feeds, onnxruntime's spinning threads off; the table gives medians and
``ratio = onnxep / onnxruntime`` (above 1: onnxep is slower). ``--threads N`` gives
both sides N intra-op threads (onnxep's through threadpoolctl, the BLAS pool);
on a loaded machine one thread each measures the kernels rather than the thread pools.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


# name -> (torch module class name, kwargs, exporter, (batch, seq, input))
RECURRENT = {
    "lstm 2 layers (torchscript)": (
        "LSTM",
        dict(input_size=64, hidden_size=128, num_layers=2),
        "torchscript",
        (8, 64, 64),
    ),
    "lstm bidirectional batch_first (dynamo)": (
        "LSTM",
        dict(input_size=64, hidden_size=128, num_layers=2, bidirectional=True, batch_first=True),
        "dynamo",
        (8, 64, 64),
    ),
    "gru bidirectional (torchscript)": (
        "GRU",
        dict(input_size=64, hidden_size=128, num_layers=2, bidirectional=True),
        "torchscript",
        (8, 64, 64),
    ),
    "gru batch_first (dynamo)": (
        "GRU",
        dict(input_size=64, hidden_size=128, num_layers=1, batch_first=True),
        "dynamo",
        (8, 64, 64),
    ),
    "rnn tanh bidirectional (torchscript)": (
        "RNN",
        dict(input_size=64, hidden_size=128, num_layers=2, bidirectional=True),
        "torchscript",
        (8, 64, 64),
    ),
    # a packed sequence: the TorchScript exporter writes sequence_lens
    "lstm bidirectional packed, sequence_lens (torchscript)": (
        "LSTM",
        dict(input_size=64, hidden_size=128, bidirectional=True, batch_first=True),
        "packed",
        (8, 64, 64),
    ),
}

#: the lengths of the packed benchmark's sequences: from full to a quarter
PACKED_LENS = np.linspace(64, 16, 8).astype(np.int64)


def export_recurrent(
    kind: str, kwargs: dict, exporter: str, shape: tuple[int, int, int]
) -> onnx.ModelProto:
    """An ``nn.<kind>`` stack (random weights, seed 0) exported with its output sequence."""
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = getattr(torch.nn, kind)(**kwargs)

        def forward(self, x, lens=None):
            if lens is None:
                return self.rnn(x)[0]
            from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

            packed = pack_padded_sequence(x, lens, batch_first=True, enforce_sorted=False)
            y, _ = pad_packed_sequence(self.rnn(packed)[0], True, total_length=x.shape[1])
            return y

    torch.manual_seed(0)
    net = Net().eval()
    b, s, i = shape
    x = torch.randn(*((b, s, i) if kwargs.get("batch_first") else (s, b, i)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "packed":
            buf = io.BytesIO()
            lens = torch.from_numpy(PACKED_LENS[:b])
            names = ["x", "lens"]
            torch.onnx.export(net, (x, lens), buf, dynamo=False, opset_version=17,
                              input_names=names, output_names=["y"])  # fmt: skip
            return onnx.load_from_string(buf.getvalue())
        if exporter == "dynamo":
            return torch.onnx.export(
                net, (x,), dynamo=True, opset_version=18, input_names=["x"], output_names=["y"]
            ).model_proto
        buf = io.BytesIO()
        torch.onnx.export(
            net, (x,), buf, dynamo=False, opset_version=17, input_names=["x"], output_names=["y"]
        )
    return onnx.load_from_string(buf.getvalue())


def rotary_block(
    batch: int = 1, seq: int = 64, heads: int = 8, kv_heads: int = 2, dim: int = 32
) -> onnx.ModelProto:
    """RMSNormalization, q/k/v projections, RotaryEmbedding and Attention (GQA, causal), as
    the opset-23 spec writes them; no exporter emits RotaryEmbedding yet."""
    rng = np.random.default_rng(0)
    hidden = heads * dim
    f32 = TensorProto.FLOAT

    def init(name, *shape, scale=0.05):
        value = (rng.standard_normal(shape) * scale).astype(np.float32)
        return numpy_helper.from_array(value, name)

    pos = np.arange(4096, dtype=np.float32)[:, None]
    inv = 1.0 / (10000 ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    inits = [
        numpy_helper.from_array((1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32), "g"),
        init("wq", hidden, heads * dim),
        init("wk", hidden, kv_heads * dim),
        init("wv", hidden, kv_heads * dim),
        init("wo", heads * dim, hidden),
        numpy_helper.from_array(np.cos(pos * inv).astype(np.float32), "cos"),
        numpy_helper.from_array(np.sin(pos * inv).astype(np.float32), "sin"),
        numpy_helper.from_array(np.array([0, 0, -1, dim], np.int64), "shp"),
    ]
    nodes = [
        helper.make_node("RMSNormalization", ["x", "g"], ["h"], epsilon=1e-6, axis=-1),
        helper.make_node("MatMul", ["h", "wq"], ["q"]),
        helper.make_node("MatMul", ["h", "wk"], ["k"]),
        helper.make_node("MatMul", ["h", "wv"], ["v"]),
        helper.make_node("RotaryEmbedding", ["q", "cos", "sin", "pos"], ["qr"], num_heads=heads),
        helper.make_node("RotaryEmbedding", ["k", "cos", "sin", "pos"], ["kr"], num_heads=kv_heads),
        helper.make_node(
            "Attention",
            ["qr", "kr", "v"],
            ["a"],
            q_num_heads=heads,
            kv_num_heads=kv_heads,
            is_causal=1,
        ),  # fmt: skip
        helper.make_node("MatMul", ["a", "wo"], ["o"]),
        helper.make_node("Add", ["x", "o"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "rotary_block",
        [
            helper.make_tensor_value_info("x", f32, ["batch", "seq", hidden]),
            helper.make_tensor_value_info("pos", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("y", f32, ["batch", "seq", hidden])],
        inits[:-1],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
    onnx.checker.check_model(model)
    return model


def rotary_feeds(batch: int = 1, seq: int = 64, hidden: int = 256) -> dict:
    rng = np.random.default_rng(1)
    return {
        "x": rng.standard_normal((batch, seq, hidden)).astype(np.float32),
        "pos": np.tile(np.arange(seq, dtype=np.int64), (batch, 1)),
    }


def build(scratch: Path, only: list[str] | None = None) -> dict[str, tuple[Path, dict]]:
    """name -> (model path, feeds) for every benchmark model, exported into ``scratch``."""
    out: dict[str, tuple[Path, dict]] = {}
    rng = np.random.default_rng(0)

    def wanted(name: str) -> bool:
        return not only or any(o in name for o in only)

    for k, (name, (kind, kw, exporter, shape)) in enumerate(RECURRENT.items()):
        if not wanted(name):
            continue
        path = scratch / f"recurrent{k}.onnx"
        onnx.save(export_recurrent(kind, kw, exporter, shape), path)
        b, s, i = shape
        x = rng.standard_normal((b, s, i) if kw.get("batch_first") else (s, b, i))
        feeds = {"x": x.astype(np.float32)}
        if exporter == "packed":
            feeds["lens"] = PACKED_LENS[:b]
        out[name] = (path, feeds)
    name = "tiny llama opset 23 (dynamo), prefill 32 over 16 past"
    if wanted(name):
        from bench.factory.torch_models import export_llama

        path = scratch / "llama23.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = export_llama(path, fused=True, opset=23)
        feeds = {"input_ids": rng.integers(0, 512, (1, 32)).astype(np.int64)}
        for inp in model.graph.input[1:]:
            feeds[inp.name] = rng.standard_normal((1, 2, 16, 64)).astype(np.float32)
        out[name] = (path, feeds)
    name = "rotary + attention block opset 23 (onnx.helper), 64 tokens"
    if wanted(name):
        path = scratch / "rotary_block.onnx"
        onnx.save(rotary_block(), path)
        out[name] = (path, rotary_feeds())
    return out


def measure(path: Path, feeds: dict, runs: int, warmup: int, threads: int) -> tuple:
    """Medians (ms) of onnxep ``["cpu"]`` and onnxruntime CPU, runs interleaved."""
    import onnxruntime as ort

    import onnxep
    from bench.cpu_profiles import alternating_medians

    opts = onnxep.SessionOptions()
    so = ort.SessionOptions()
    # spinning threads would keep a core busy into the other side's run
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads:
        opts.intra_op_num_threads = threads
        so.intra_op_num_threads = threads
    ours = onnxep.InferenceSession(str(path), sess_options=opts, providers=["cpu"])
    peer = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    a, b = alternating_medians(ours, peer, feeds, runs, warmup)
    return 1e3 * a, 1e3 * b


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument(
        "--threads", type=int, default=0,
        help="intra-op threads for both sides (0: each library's default)",
    )  # fmt: skip
    ap.add_argument("--only", nargs="*", help="substrings of the model names to run")
    ap.add_argument("--json", help="write the table as JSON here")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        models = build(Path(tmp), args.only)
        for name, (path, feeds) in models.items():
            ours, ort = measure(path, feeds, args.runs, args.warmup, args.threads)
            rows.append({"model": name, "onnxep_ms": ours, "ort_ms": ort, "ratio": ours / ort})
            print(f"{name:58s} onnxep {ours:8.3f} ms  ort {ort:8.3f} ms  ratio {ours / ort:5.2f}")
            sys.stdout.flush()
    if args.json:
        out = {"threads": args.threads, "runs": args.runs, "rows": rows}
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
