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
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import onnx
import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent


class Decoder(nn.Module):
    def __init__(
        self, vocab=512, hidden=256, layers=2, heads=4, kv_heads=2, inter=512, fused=False
    ):
        super().__init__()
        self.heads, self.kv_heads, self.dim = heads, kv_heads, hidden // heads
        self.fused = fused
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList()
        for _ in range(layers):
            self.layers.append(
                nn.ModuleDict(
                    {
                        "q": nn.Linear(hidden, heads * self.dim, bias=False),
                        "k": nn.Linear(hidden, kv_heads * self.dim, bias=False),
                        "v": nn.Linear(hidden, kv_heads * self.dim, bias=False),
                        "o": nn.Linear(heads * self.dim, hidden, bias=False),
                        "gate": nn.Linear(hidden, inter, bias=False),
                        "up": nn.Linear(hidden, inter, bias=False),
                        "down": nn.Linear(inter, hidden, bias=False),
                    }
                )
            )
        self.norm_w = nn.ParameterList(
            [nn.Parameter(1 + 0.1 * torch.randn(hidden)) for _ in range(2 * layers + 1)]
        )
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, self.dim, 2).float() / self.dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def rms(self, x, i):
        w = self.norm_w[i]
        if self.fused:
            return F.rms_norm(x, (x.shape[-1],), w, eps=1e-6)
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + 1e-6) * w

    @staticmethod
    def rotate(x, cos, sin):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
        return x * cos + torch.cat([-x2, x1], dim=-1) * sin

    def forward(self, input_ids, *past):
        b, s = input_ids.shape
        p = past[0].shape[2]
        pos = torch.arange(s, device=input_ids.device) + p
        freqs = pos[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        q_pos = pos[:, None]
        k_pos = torch.arange(p + s, device=input_ids.device)[None, :]
        allowed = k_pos <= q_pos
        x = self.embed(input_ids)
        presents = []
        for i, layer in enumerate(self.layers):
            h = self.rms(x, 2 * i)
            q = layer["q"](h).view(b, s, self.heads, self.dim).transpose(1, 2)
            k = layer["k"](h).view(b, s, self.kv_heads, self.dim).transpose(1, 2)
            v = layer["v"](h).view(b, s, self.kv_heads, self.dim).transpose(1, 2)
            q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
            k = torch.cat([past[2 * i], k], dim=2)
            v = torch.cat([past[2 * i + 1], v], dim=2)
            presents += [k, v]
            if self.fused:
                a = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)
            else:
                rep = self.heads // self.kv_heads
                kk = k.repeat_interleave(rep, dim=1)
                vv = v.repeat_interleave(rep, dim=1)
                scores = q @ kk.transpose(-1, -2) / math.sqrt(self.dim)
                scores = scores.masked_fill(~allowed, float("-inf"))
                a = torch.softmax(scores, dim=-1) @ vv
            a = a.transpose(1, 2).reshape(b, s, self.heads * self.dim)
            x = x + layer["o"](a)
            h = self.rms(x, 2 * i + 1)
            x = x + layer["down"](F.silu(layer["gate"](h)) * layer["up"](h))
        logits = self.lm_head(self.rms(x, len(self.norm_w) - 1))
        return (logits, *presents)


def export_decoder(fused: bool, opset: int, name: str) -> None:
    torch.manual_seed(0)
    model = Decoder(fused=fused).eval()
    layers, kvh, d = len(model.layers), model.kv_heads, model.dim
    ids = torch.randint(0, 512, (1, 8))
    past = [torch.randn(1, kvh, 16, d) for _ in range(2 * layers)]
    batch, seq, plen = (torch.export.Dim(n, max=4096) for n in ("batch", "seq", "past"))
    shapes = {"input_ids": {0: batch, 1: seq}, "past": tuple([{0: batch, 2: plen}] * (2 * layers))}
    in_names = ["input_ids"] + [f"past_{kv}_{i}" for i in range(layers) for kv in ("key", "value")]
    out_names = ["logits"] + [f"present_{kv}_{i}" for i in range(layers) for kv in ("key", "value")]
    prog = torch.onnx.export(
        model,
        (ids, *past),
        dynamo=True,
        opset_version=opset,
        dynamic_shapes=shapes,
        input_names=in_names,
        output_names=out_names,
        optimize=True,
    )
    prog.save(str(HERE / name))
    print(f"wrote {name}: ops {sorted({n.op_type for n in prog.model_proto.graph.node})}")


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
    prog.save(str(HERE / "hf_llama.onnx"))
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
    prog.save(str(HERE / "hf_llama_kv.onnx"))
    print("wrote hf_llama_kv.onnx")


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.skip = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        return F.relu(self.b2(self.c2(y)) + self.skip(x))


class ResNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2)
        )
        self.blocks = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2))
        self.head = nn.Linear(64, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def export_resnet() -> None:
    torch.manual_seed(0)
    model = ResNet()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    model.eval()
    x = torch.randn(1, 3, 64, 64)
    prog = torch.onnx.export(
        model,
        (x,),
        dynamo=True,
        dynamic_shapes={"x": {0: torch.export.Dim("batch", max=64)}},
        input_names=["image"],
        output_names=["logits"],
    )
    prog.save(str(HERE / "resnet_cnn.onnx"))
    print("wrote resnet_cnn.onnx")


if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    export_decoder(fused=False, opset=18, name="llama_kv.onnx")
    export_decoder(fused=True, opset=23, name="llama_kv_opset23.onnx")
    export_resnet()
    export_hf_llama()
    for f in sorted(HERE.glob("*.onnx")):
        m = onnx.load(str(f))
        print(f.name, f.stat().st_size // 1024, "KiB", sorted({n.op_type for n in m.graph.node}))
