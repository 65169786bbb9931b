"""Regenerate tests/data/genai/: onnxruntime-genai builder exports of tiny random models.

    pip install -e ".[export]"      # torch 2.13.0 CPU, transformers, onnxruntime-genai
    python tests/data/make_genai_models.py

Each model is a random-weight transformers model built offline from a tiny
config, saved, and exported by ``python -m onnxruntime_genai.models.builder``:
- qwen2_fp32/, qwen2_int4/: Qwen2ForCausalLM (hidden 256, 2 layers, 4/2 heads),
  exported with -p fp32 and -p int4 (MatMulNBits).
- qwen3_5_fp32/: Qwen3_5ForConditionalGeneration with a tiny text config (three
  linear-attention layers to one full-attention layer) and a tiny vision config;
  the builder exports the text decoder. onnxruntime cannot run it (its
  RotaryEmbedding rejects 3-D position ids), so the greedy tokens of
  transformers' own forward pass on the same weights are recorded in
  qwen3_5_tokens.json.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent / "genai"
PROMPT_LEN, STEPS = 8, 16


def qwen2() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(cfg).eval()


def qwen3_5() -> torch.nn.Module:
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    torch.manual_seed(0)
    text = dict(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    vision = dict(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=128,
        num_position_embeddings=64,
    )
    cfg = Qwen3_5Config(text_config=text, vision_config=vision)
    cfg.architectures = ["Qwen3_5ForConditionalGeneration"]
    model = Qwen3_5ForConditionalGeneration(cfg).eval()
    # Random init leaves some norms at exactly zero or one; spread them so the
    # decode exercises every weight.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def export(model: torch.nn.Module, precision: str, out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        hf = Path(tmp) / "hf"
        model.save_pretrained(hf)
        built = Path(tmp) / "out"
        cmd = [
            sys.executable,
            "-m",
            "onnxruntime_genai.models.builder",
            "-i",
            str(hf),
            "-o",
            str(built),
            "-p",
            precision,
            "-e",
            "cpu",
        ]
        subprocess.run(cmd, check=True, capture_output=True)
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        for name in ("model.onnx", "model.onnx.data", "genai_config.json"):
            if (built / name).exists():
                shutil.copy(built / name, out / name)
    print(f"wrote {out}")


def greedy_tokens(model: torch.nn.Module) -> dict:
    torch.manual_seed(1)
    prompt = torch.randint(0, 512, (1, PROMPT_LEN))
    ids = prompt
    tokens = []
    with torch.no_grad():
        for _ in range(STEPS):
            logits = model(input_ids=ids, use_cache=False).logits
            nxt = int(logits[0, -1].argmax())
            tokens.append(nxt)
            ids = torch.cat([ids, torch.tensor([[nxt]])], dim=1)
    return {"prompt": prompt[0].tolist(), "tokens": tokens}


if __name__ == "__main__":
    export(qwen2(), "fp32", HERE / "qwen2_fp32")
    export(qwen2(), "int4", HERE / "qwen2_int4")
    q35 = qwen3_5()
    export(q35, "fp32", HERE / "qwen3_5_fp32")
    (HERE / "qwen3_5_tokens.json").write_text(json.dumps(greedy_tokens(q35)) + "\n")
    print("wrote qwen3_5_tokens.json")
