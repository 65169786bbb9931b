"""Regenerate the exported test models in this folder (needs ``pip install -e .[export]``).

    python tests/data/make_models.py

Models (random weights, seeded; each a few MB):
- llama_kv.onnx: a LLaMA-style decoder (RMSNorm, rotary, GQA, SiLU-gated MLP)
  with a KV cache, written in plain torch ops and exported by
  ``torch.onnx.export(..., dynamo=True)`` at opset 18. Size matches the CPU
  benchmark: hidden 256, 2 layers, 4 query / 2 KV heads, intermediate 512.
- llama_kv_opset23.onnx: the same decoder written with ``F.rms_norm`` and
  ``F.scaled_dot_product_attention(..., enable_gqa=True)``, exported at opset
  23 so the exporter emits ``RMSNormalization`` and ``Attention``.
- hf_llama.onnx / hf_llama_kv.onnx: transformers' ``LlamaForCausalLM`` built
  offline from a tiny config, exported without and with a KV cache.
- resnet_cnn.onnx: a ResNet-style CNN (conv, batch norm, residual blocks, pooling).

The torch modules live in ``bench/factory/torch_models.py``. The exporter
records file names and line numbers in node metadata, so a fresh export equals
the committed one in graph and weights, not byte for byte.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import onnx
import torch
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repo root, for bench/ (not an installed package)

from bench.factory.torch_models import export_llama, export_resnet  # noqa: E402

OUT = HERE  # --out changes it, e.g. to compare a fresh export with the committed one


def export_decoder(fused: bool, opset: int, name: str) -> None:
    model = export_llama(OUT / name, fused=fused, opset=opset)
    print(f"wrote {name}: ops {sorted({n.op_type for n in model.graph.node})}")


def export_hf_llama() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.cache_utils import DynamicCache

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    model = LlamaForCausalLM(cfg).eval()

    class NoCache(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(
                input_ids=input_ids, attention_mask=attention_mask, use_cache=False
            ).logits

    class WithCache(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, *past):
            cache = DynamicCache(config=cfg)
            for i in range(cfg.num_hidden_layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.m(
                input_ids=input_ids,
                attention_mask=attention_mask,
                past_key_values=cache,
                use_cache=True,
            )
            flat = []
            for i in range(cfg.num_hidden_layers):
                layer = out.past_key_values.layers[i]
                flat += [layer.keys, layer.values]
            return (out.logits, *flat)

    batch, seq = torch.export.Dim("batch", max=64), torch.export.Dim("seq", max=256)
    ids = torch.randint(0, 512, (2, 6))
    mask = torch.ones(2, 6, dtype=torch.int64)
    prog = torch.onnx.export(
        NoCache(model),
        (ids, mask),
        dynamo=True,
        dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
        input_names=["input_ids", "attention_mask"],
        output_names=["logits"],
    )
    prog.save(str(OUT / "hf_llama.onnx"))
    print("wrote hf_llama.onnx")

    layers, kvh, d = cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.hidden_size // 4
    plen, total = torch.export.Dim("past", max=256), torch.export.Dim("total", max=512)
    past = [torch.randn(2, kvh, 5, d) for _ in range(2 * layers)]
    ids = torch.randint(0, 512, (2, 3))
    mask = torch.ones(2, 8, dtype=torch.int64)
    prog = torch.onnx.export(
        WithCache(model),
        (ids, mask, *past),
        dynamo=True,
        dynamic_shapes={
            "input_ids": {0: batch, 1: seq},
            "attention_mask": {0: batch, 1: total},
            "past": tuple([{0: batch, 2: plen}] * (2 * layers)),
        },
        input_names=["input_ids", "attention_mask"]
        + [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")],
        output_names=["logits"]
        + [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")],
    )
    prog.save(str(OUT / "hf_llama_kv.onnx"))
    print("wrote hf_llama_kv.onnx")


def export_resnet_cnn() -> None:
    export_resnet(OUT / "resnet_cnn.onnx")
    print("wrote resnet_cnn.onnx")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write to (default: here)")
    OUT = parser.parse_args().out
    OUT.mkdir(parents=True, exist_ok=True)
    warnings.filterwarnings("ignore")
    export_decoder(fused=False, opset=18, name="llama_kv.onnx")
    export_decoder(fused=True, opset=23, name="llama_kv_opset23.onnx")
    export_resnet_cnn()
    export_hf_llama()
    for f in sorted(OUT.glob("*.onnx")):
        m = onnx.load(str(f))
        print(f.name, f.stat().st_size // 1024, "KiB", sorted({n.op_type for n in m.graph.node}))
