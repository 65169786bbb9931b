"""The pieces LLaMA-family decoders share, emitted as onnxruntime-genai's builder emits them.

One ``Emitter`` per model: it holds the graph, the weight source and the
precision, and tracks the residual stream the way the builder does (the first
norm is ``SimplifiedLayerNormalization``, every later one a
``SkipSimplifiedLayerNormalization`` that adds the pending residual).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto

from .config import DecoderConfig
from .graph import MS, GraphWriter
from .quant import quantize_nbits
from .weights import WeightSource


@dataclass(frozen=True)
class Precision:
    """``fp32``/``fp16``: float MatMuls; ``int4``/``int8``: MatMulNBits on fp32 activations.

    (``-p int4 -e cpu`` in the builder keeps fp32 activations; so do we.)
    """

    name: str
    block_size: int = 32
    symmetric: bool = True  # the builder's default; False adds zero points
    accuracy_level: int = 4  # the builder's default for CPU

    def __post_init__(self) -> None:
        if self.name not in ("fp32", "fp16", "int4", "int8"):
            raise ValueError(f"dtype must be fp32, fp16, int4 or int8, not {self.name!r}")

    @property
    def bits(self) -> int:
        return {"int4": 4, "int8": 8}.get(self.name, 0)

    @property
    def np_io(self) -> type:
        return np.float16 if self.name == "fp16" else np.float32

    @property
    def elem(self) -> int:
        return TensorProto.FLOAT16 if self.name == "fp16" else TensorProto.FLOAT


def rotary_caches(dim: int, theta: float, length: int) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin caches [length, dim/2] for rotary over ``dim`` dims, as the builder makes them.

    With torch importable they are computed with the builder's own torch float32
    ops, bit for bit; NumPy's float32 pow and cos differ from torch's in the last
    place for ~10% of entries, which int8-activation MatMulNBits can amplify.
    """
    try:
        import torch
    except ImportError:
        inv = np.float32(1.0) / (
            np.float32(theta) ** (np.arange(0, dim, 2).astype(np.float32) / np.float32(dim))
        )
        freqs = np.outer(np.arange(length, dtype=np.float32), inv).astype(np.float32)
        return np.cos(freqs), np.sin(freqs)
    inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    freqs = torch.outer(torch.arange(length, dtype=torch.int64).type_as(inv), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[:, : dim // 2].numpy(), emb.sin()[:, : dim // 2].numpy()


class Emitter:
    def __init__(
        self, g: GraphWriter, src: WeightSource, cfg: DecoderConfig, prec: Precision
    ) -> None:
        self.g, self.src, self.cfg, self.prec = g, src, cfg, prec
        self.residual: str | None = None  # the running sum the next Skip norm adds into
        self.pending: str | None = None  # the sublayer output not yet added to it
        self._tied: list[str] = []  # LM head initializers the embedding shares

    # -- weights --------------------------------------------------------------------
    def weight(self, hf_name: str, shape: tuple[int, ...], kind: str = "linear") -> np.ndarray:
        return self.src.get(hf_name, shape, kind)

    def float_init(self, name: str, array: np.ndarray) -> str:
        return self.g.init(name, array.astype(self.prec.np_io))

    # -- ops ------------------------------------------------------------------------
    def matmul(self, basename: str, x: str, w_kn: np.ndarray, output: str | None = None) -> str:
        """``x @ w_kn`` as the builder writes it: MatMul, or MatMulNBits for int4/int8."""
        inits = self.weight_inits(basename[1:].replace("/", "."), w_kn)
        k, n = w_kn.shape
        return self._matmul_with(x, basename, inits, k, n, output or f"{basename}/output_0")

    def weight_inits(self, prefix: str, w_kn: np.ndarray) -> list[str]:
        """``{prefix}.weight``, or ``.weight_Q{bits}``, ``.weight_scales`` (, zero points)."""
        if not self.prec.bits:
            return [self.float_init(f"{prefix}.weight", w_kn)]
        bits = self.prec.bits
        q = quantize_nbits(w_kn, bits, self.prec.block_size, self.prec.symmetric)
        inits = [
            self.g.init(f"{prefix}.weight_Q{bits}", q.packed),
            self.g.init(f"{prefix}.weight_scales", q.scales.astype(self.prec.np_io)),
        ]
        if q.zero_points is not None:
            inits.append(self.g.init(f"{prefix}.weight_zero_points", q.zero_points))
        return inits

    def _matmul_with(
        self, x: str, basename: str, inits: list[str], k: int, n: int, out: str
    ) -> str:
        if not self.prec.bits:
            return self.g.node("MatMul", [x, inits[0]], basename, [out])[0]
        bits = self.prec.bits
        return self.g.node(
            "MatMulNBits",
            [x, *inits],
            f"{basename}_Q{bits}",
            [out],
            MS,
            K=k,
            N=n,
            accuracy_level=self.prec.accuracy_level,
            bits=bits,
            block_size=self.prec.block_size,
        )[0]

    def linear(self, basename: str, x: str, hf_name: str, n_out: int, n_in: int) -> str:
        """A Hugging Face ``Linear`` ([out, in]) without bias, as a MatMul."""
        return self.matmul(basename, x, self.weight(hf_name, (n_out, n_in)).T)

    def embedding(self) -> str:
        """Embedding Gather; with tied embeddings, shared with the LM head as the builder does.

        Tied fp32/fp16: Gather from ``Transpose(lm_head.MatMul.weight)``. Tied int4:
        ``GatherBlockQuantized`` from the LM head's 4-bit blocks. (Tied int8 keeps
        a separate float table, as the builder does.)
        """
        cfg, g = self.cfg, self.g
        table = self.weight("model.embed_tokens.weight", (cfg.vocab, cfg.hidden))
        if not (cfg.tie_embeddings and self.prec.name in ("fp32", "fp16", "int4")):
            w = self.float_init("model.embed_tokens.weight", table)
            return g.op("Gather", [w, "input_ids"], "/model/embed_tokens/Gather")
        self._tied = self.weight_inits("lm_head.MatMul", table.T)
        base = "/model/embed_tokens"
        if not self.prec.bits:
            t = g.op("Transpose", [self._tied[0]], f"{base}/Transpose", perm=[1, 0])
            return g.op("Gather", [t, "input_ids"], f"{base}/Gather")
        shape = g.constant("INT64", [cfg.vocab, cfg.hidden * self.prec.bits // 8])
        flat = g.op("Reshape", [self._tied[0], shape], f"{base}/Reshape")
        inputs = [flat, "input_ids", self._tied[1], *self._tied[2:]]
        return g.op(
            "GatherBlockQuantized",
            inputs,
            f"{base}/GatherBlockQuantized",
            MS,
            bits=self.prec.bits,
            block_size=self.prec.block_size,
            gather_axis=0,
            quantize_axis=1,
        )

    def norm(self, base: str, hf_name: str, x: str | None = None, final: bool = False) -> str:
        """RMSNorm: the first one plain, every later one fused with the residual add."""
        w = self.float_init(f"{base[1:].replace('/', '.')}.weight", self._norm_w(hf_name))
        eps = self.cfg.eps
        if self.residual is None:
            assert x is not None
            self.residual = x
            return self.g.node(
                "SimplifiedLayerNormalization",
                [x, w],
                f"{base}/LayerNorm",
                [f"{base}/output_0"],
                axis=-1,
                epsilon=eps,
                stash_type=1,
            )[0]
        assert self.pending is not None
        outs = [f"{base}/output_0"] if final else [f"{base}/output_0", "", "", f"{base}/output_3"]
        self.g.node(
            "SkipSimplifiedLayerNormalization",
            [self.residual, self.pending, w],
            f"{base}/SkipLayerNorm",
            outs,
            MS,
            epsilon=eps,
        )
        self.residual, self.pending = outs[-1], None
        return outs[0]

    def _norm_w(self, hf_name: str) -> np.ndarray:
        return self.weight(hf_name, (self.cfg.hidden,), "norm")

    def mlp(self, i: int, x: str) -> str:
        """SiLU-gated MLP: gate and up MatMuls, Sigmoid, Mul, Mul, down MatMul."""
        cfg, base, hf = self.cfg, f"/model/layers.{i}/mlp", f"model.layers.{i}.mlp"
        gate = self.linear(
            f"{base}/gate_proj/MatMul", x, f"{hf}.gate_proj.weight", cfg.intermediate, cfg.hidden
        )
        up = self.linear(
            f"{base}/up_proj/MatMul", x, f"{hf}.up_proj.weight", cfg.intermediate, cfg.hidden
        )
        sig = self.g.op("Sigmoid", [gate], f"{base}/act_fn/Sigmoid")
        act = self.g.op("Mul", [gate, sig], f"{base}/act_fn/Mul")
        prod = self.g.op("Mul", [act, up], f"{base}/Mul")
        return self.linear(
            f"{base}/down_proj/MatMul", prod, f"{hf}.down_proj.weight", cfg.hidden, cfg.intermediate
        )

    def mask_lengths(self) -> tuple[str, str]:
        """``seqlens_k`` (ReduceSum(mask) - 1, int32) and ``total_sequence_length`` (int32)."""
        base = "/model/attn_mask_reformat/attn_mask_subgraph"
        one_list = self.g.constant("INT64", [1])
        s = self.g.op("ReduceSum", ["attention_mask", one_list], f"{base}/ReduceSum", keepdims=0)
        s = self.g.op("Sub", [s, one_list], f"{base}/Sub")
        seqlens = self.g.op("Cast", [s], f"{base}/Sub/Cast", to=TensorProto.INT32)
        shape = self.g.op("Shape", ["attention_mask"], f"{base}/Shape")
        one = self.g.constant("INT64", 1)
        total = self.g.op("Gather", [shape, one], f"{base}/Gather", axis=0)
        total = self.g.op("Cast", [total], f"{base}/Gather/Cast", to=TensorProto.INT32)
        return seqlens, total

    def lm_head(self, x: str) -> str:
        cfg = self.cfg
        if self._tied:
            return self._matmul_with(
                x, "/lm_head/MatMul", self._tied, cfg.hidden, cfg.vocab, "logits"
            )
        name = "lm_head.weight"
        if cfg.tie_embeddings and (self.src.weights is None or name not in self.src.weights):
            name = "model.embed_tokens.weight"
        w = self.weight(name, (cfg.vocab, cfg.hidden))
        return self.matmul("/lm_head/MatMul", x, w.T, output="logits")

    def decoder_io(self, extra_inputs: list[tuple[str, int, list]] = ()) -> None:
        """input_ids, attention_mask (and extras), then past keys of every layer, then values."""
        self.g.input("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])
        self.g.input("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"])
        for name, elem, shape in extra_inputs:
            self.g.input(name, elem, shape)
        self.g.output("logits", self.prec.elem, ["batch_size", "sequence_length", self.cfg.vocab])

    def kv_cache_io(self, layer_ids: list[int]) -> None:
        """The builder lists every layer's key before any value, inputs and outputs alike.

        Its last dim is the symbolic ``kv_cache_dim``; here it is the head size,
        so a decode loop can make an empty cache from the declared shape.
        """
        cfg = self.cfg
        for kv in ("key", "value"):
            for i in layer_ids:
                self.g.input(
                    f"past_key_values.{i}.{kv}",
                    self.prec.elem,
                    ["batch_size", cfg.kv_heads, "past_sequence_length", cfg.head_dim],
                )
        for kv in ("key", "value"):
            for i in layer_ids:
                self.g.output(
                    f"present.{i}.{kv}",
                    self.prec.elem,
                    ["batch_size", cfg.kv_heads, "total_sequence_length", cfg.head_dim],
                )
