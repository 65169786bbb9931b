"""Standard-op models written in plain torch and exported by ``torch.onnx.export(dynamo=True)``.

- ``Decoder``: a LLaMA-style decoder (RMSNorm, rotary, GQA, SiLU-gated MLP)
  with a KV cache; ``fused=True`` writes it with ``F.rms_norm`` and
  ``F.scaled_dot_product_attention`` so opset 23 exports ``RMSNormalization``
  and ``Attention``.
- ``ResNet``: a small ResNet-style CNN (conv, batch norm, residual blocks, pooling).
- ``ResNet50``: a ResNet-50-sized classifier (bottleneck blocks 3-4-6-3, widths 64-2048).
- ``VoiceActivity``: a Conv1d + LSTM voice-activity model over raw audio.
- ``YoloLike``: a YOLO-style detector (a C2f/CSP backbone of conv + SiLU, an SPPF block,
  an upsample + concat neck and a detection head at two strides).
- ``BertEncoder``: a BERT-style encoder (embeddings + LayerNorm, encoder layers
  of multi-head attention written out in torch ops and a GELU FFN).

``tests/data/make_models.py`` imports these to regenerate the test models.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import onnx
import torch
import torch.nn.functional as F
from torch import nn


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


def _shortcut(cin: int, cout: int, stride: int) -> nn.Module:
    """A residual block's skip path: a 1x1 projection with a batch norm where the shape
    changes, else the identity."""
    if stride != 1 or cin != cout:
        return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
    return nn.Identity()


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.skip = _shortcut(cin, cout, stride)

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


class Bottleneck(nn.Module):
    """ResNet-50's block: 1x1 reduce, 3x3 (the stride), 1x1 expand, batch norms, residual."""

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * 4
        self.c1 = nn.Conv2d(cin, width, 1, bias=False)
        self.b1 = nn.BatchNorm2d(width)
        self.c2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.b2 = nn.BatchNorm2d(width)
        self.c3 = nn.Conv2d(width, cout, 1, bias=False)
        self.b3 = nn.BatchNorm2d(cout)
        self.skip = _shortcut(cin, cout, stride)

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = F.relu(self.b2(self.c2(y)))
        return F.relu(self.b3(self.c3(y)) + self.skip(x))


class ResNet50(nn.Module):
    """ResNet-50's layout (25.6 M parameters at 1000 classes), written out here."""

    def __init__(self, classes: int = 1000, layers=(3, 4, 6, 3)) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(),
            nn.MaxPool2d(3, 2, 1),
        )
        blocks, cin = [], 64
        for i, n in enumerate(layers):
            width = 64 * 2**i
            for j in range(n):
                blocks.append(Bottleneck(cin, width, 2 if (j == 0 and i > 0) else 1))
                cin = width * 4
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class ConvSiLU(nn.Module):
    """YOLO's conv unit: conv, batch norm, SiLU."""

    def __init__(self, cin: int, cout: int, k: int = 1, s: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return F.silu(self.bn(self.conv(x)))


class C2f(nn.Module):
    """The CSP block of YOLOv8: split, a chain of residual 3x3 pairs, concat of every stage."""

    def __init__(self, cin: int, cout: int, n: int = 1, shortcut: bool = True) -> None:
        super().__init__()
        self.h = cout // 2
        self.cv1 = ConvSiLU(cin, 2 * self.h)
        self.cv2 = ConvSiLU((2 + n) * self.h, cout)
        self.m = nn.ModuleList(
            nn.Sequential(ConvSiLU(self.h, self.h, 3), ConvSiLU(self.h, self.h, 3))
            for _ in range(n)
        )
        self.shortcut = shortcut

    def forward(self, x):
        ys = list(self.cv1(x).chunk(2, 1))
        for m in self.m:
            y = m(ys[-1])
            ys.append(ys[-1] + y if self.shortcut else y)
        return self.cv2(torch.cat(ys, 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling (fast): three chained 5x5 max pools, concatenated."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.cv1 = ConvSiLU(cin, cin // 2)
        self.cv2 = ConvSiLU(cin * 2, cout)
        self.pool = nn.MaxPool2d(5, 1, 2)

    def forward(self, x):
        x = self.cv1(x)
        y1 = self.pool(x)
        y2 = self.pool(y1)
        return self.cv2(torch.cat([x, y1, y2, self.pool(y2)], 1))


class YoloLike(nn.Module):
    """A YOLOv8-n-sized detector: strides 8/16/32 backbone, an FPN neck, two output scales.

    The output is (batch, 4 + classes, cells): box regressions and class scores of every
    cell of the stride-8 and stride-16 maps (no NMS: that runs outside the model).
    """

    def __init__(self, classes: int = 80, w: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(ConvSiLU(3, w, 3, 2), ConvSiLU(w, 2 * w, 3, 2), C2f(2 * w, 2 * w))
        self.p3 = nn.Sequential(ConvSiLU(2 * w, 4 * w, 3, 2), C2f(4 * w, 4 * w, 2))
        self.p4 = nn.Sequential(ConvSiLU(4 * w, 8 * w, 3, 2), C2f(8 * w, 8 * w, 2))
        self.p5 = nn.Sequential(
            ConvSiLU(8 * w, 16 * w, 3, 2), C2f(16 * w, 16 * w), SPPF(16 * w, 16 * w)
        )
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.n4 = C2f(24 * w, 8 * w, shortcut=False)
        self.n3 = C2f(12 * w, 4 * w, shortcut=False)
        self.head3 = nn.Sequential(ConvSiLU(4 * w, 4 * w, 3), nn.Conv2d(4 * w, 4 + classes, 1))
        self.head4 = nn.Sequential(ConvSiLU(8 * w, 4 * w, 3), nn.Conv2d(4 * w, 4 + classes, 1))

    def forward(self, x):
        p3 = self.p3(self.stem(x))
        p4 = self.p4(p3)
        p5 = self.p5(p4)
        n4 = self.n4(torch.cat([self.up(p5), p4], 1))
        n3 = self.n3(torch.cat([self.up(n4), p3], 1))
        o3 = self.head3(n3).flatten(2)
        o4 = self.head4(n4).flatten(2)
        return torch.cat([o3, o4], 2)


class VoiceActivity(nn.Module):
    """A voice-activity model: a Conv1d front end over raw audio ([batch, 1, samples]), an
    LSTM over its frames and a dense head giving one speech probability per clip."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(1, 32, 9, stride=4)
        self.c2 = nn.Conv1d(32, 32, 5, stride=2)
        self.lstm = nn.LSTM(32, 64, batch_first=True)
        self.head = nn.Linear(64, 1)

    def forward(self, audio):
        h = torch.relu(self.c2(torch.relu(self.c1(audio))))
        out, _ = self.lstm(h.transpose(1, 2))
        return torch.sigmoid(self.head(out[:, -1]))


def randomize_batch_norms(model: nn.Module) -> nn.Module:
    """Non-trivial running statistics (a fresh BatchNorm is the identity), seeded by the caller."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return model


class EncoderLayer(nn.Module):
    """Post-norm BERT layer: attention, add, LayerNorm; GELU FFN, add, LayerNorm."""

    def __init__(self, hidden: int, heads: int, inter: int, eps: float) -> None:
        super().__init__()
        self.heads, self.dim = heads, hidden // heads
        self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
        self.o = nn.Linear(hidden, hidden)
        self.ln1 = nn.LayerNorm(hidden, eps=eps)
        self.up = nn.Linear(hidden, inter)
        self.down = nn.Linear(inter, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, s, self.heads, self.dim).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.dim) + bias
        a = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, s, h)
        x = self.ln1(x + self.o(a))
        return self.ln2(x + self.down(F.gelu(self.up(x))))


class BertEncoder(nn.Module):
    def __init__(
        self,
        vocab: int = 1024,
        hidden: int = 256,
        layers: int = 4,
        heads: int = 4,
        inter: int = 1024,
        max_positions: int = 512,
        type_vocab: int = 2,
        eps: float = 1e-12,
    ) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(max_positions, hidden)
        self.token_type = nn.Embedding(type_vocab, hidden)
        self.ln = nn.LayerNorm(hidden, eps=eps)
        self.layers = nn.ModuleList(EncoderLayer(hidden, heads, inter, eps) for _ in range(layers))

    def forward(self, input_ids, attention_mask, token_type_ids):
        s = input_ids.shape[1]
        pos = torch.arange(s, device=input_ids.device)[None]
        x = self.ln(self.word(input_ids) + self.position(pos) + self.token_type(token_type_ids))
        # padding keys get a large negative bias, as BERT's extended attention mask does
        bias = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, bias)
        return x


def export_llama(
    path: str | Path, fused: bool = False, opset: int = 18, **size: Any
) -> onnx.ModelProto:
    """The KV-cache decoder (random weights, seed 0), inputs ``input_ids`` and ``past_*``."""
    torch.manual_seed(0)
    model = Decoder(fused=fused, **size).eval()
    layers, kvh, d = len(model.layers), model.kv_heads, model.dim
    vocab = model.embed.num_embeddings
    ids = torch.randint(0, vocab, (1, 8))
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
    prog.save(str(path))
    return prog.model_proto


def export_resnet(path: str | Path) -> onnx.ModelProto:
    """The ResNet-style CNN (seed 0, batch norm statistics randomized), input ``image``."""
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
    prog.save(str(path))
    return prog.model_proto


def export_bert(path: str | Path, opset: int = 18, **size: Any) -> onnx.ModelProto:
    """The BERT-style encoder (seed 0): ids, mask and token types in, hidden states out."""
    torch.manual_seed(0)
    model = BertEncoder(**size).eval()
    vocab = model.word.num_embeddings
    ids = torch.randint(0, vocab, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    types = torch.zeros(2, 8, dtype=torch.int64)
    batch = torch.export.Dim("batch", max=256)
    seq = torch.export.Dim("sequence", max=model.position.num_embeddings)
    dyn = {0: batch, 1: seq}
    prog = torch.onnx.export(
        model,
        (ids, mask, types),
        dynamo=True,
        opset_version=opset,
        dynamic_shapes={"input_ids": dyn, "attention_mask": dyn, "token_type_ids": dyn},
        input_names=["input_ids", "attention_mask", "token_type_ids"],
        output_names=["last_hidden_state"],
        optimize=True,
    )
    prog.save(str(path))
    return prog.model_proto
