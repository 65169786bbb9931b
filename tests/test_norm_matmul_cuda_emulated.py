"""The CUDA kernels of the folded norms on the emulator, in sessions on the factory's decoders.

An emulating provider claims the norms, the GEMVs and the SwiGLU (the CUDA kernel library on
NumPy, everything else on the CPU) and runs the CUDA plugin's pass list: with
``fuse_norm_matmul`` and ``fuse_quantized_swiglu`` each decoder layer's norms run in the
prologue of the GEMV reading them (one launch), the int4 MLP's SwiGLU in its epilogue.
Both passes are exact, so the logits must equal, byte for byte, those of the same session
with the two passes off (the norms' ``norm_rows`` launches, then the GEMVs, then SwiGLU),
and the greedy tokens too. The launches are counted: the normalising instantiations ran.
"""

from __future__ import annotations

import sys
from pathlib import Path

import cuda_emulator as emu
import numpy as np
import pytest
from test_fusions_pattern import fusion
from test_gemv_nt_cuda_emulated import HOST_NT_SMEM
from test_nbits_mma_cuda_emulated import install as install_mma
from test_nbits_mma_cuda_emulated import no_old_kernels

import onnxep
from onnxep.providers.fusions import standard_fusions
from onnxep.providers_cuda.ops import gemv_nt_cuda as G
from onnxep.providers_cuda.ops import nbits_mma_cuda as M

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # bench/ is imported from the repo root, not installed
from bench.factory import build_genai_decoder  # noqa: E402

NAME = "foldemu"
MS = "com.microsoft"
OPS = {
    ("", "SimplifiedLayerNormalization"),
    (MS, "SkipSimplifiedLayerNormalization"),
    ("", "MatMul"),
    (MS, "MatMulNBits"),
    ("", "Sigmoid"),
    ("", "Mul"),
    ("onnxep", "SiLU"),
    ("onnxep", "SwiGLU"),
    ("onnxep", "MatMulNT"),
    ("onnxep", "MatMulNBits"),
    ("onnxep", "NormMatMulNT"),
    ("onnxep", "NormMatMulNBits"),
}
FOLDS = ["fuse_norm_matmul", "fuse_quantized_swiglu"]
#: One token: every product has one row, a GEMV on the emulated 4-SM device (more rows would
#: route the wider products to cuBLAS, which is not emulated).
PROMPT = np.array([17])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("fold")
    out = {}
    for name, dtype, symmetric in (("fp16", "fp16", True), ("int4-zp", "int4", False)):
        path = root / name / "model.onnx"
        build_genai_decoder("tiny", seed=6, dtype=dtype, out_path=path, symmetric=symmetric)
        out[name] = path
    return out


@pytest.fixture
def launches(monkeypatch):
    """The emulated GEMV launches by kernel name; the CUDA builders' CuPy-only helpers (the
    elementwise Sigmoid, Mul and Add, the MatMul on cuBLAS) replaced by the generic kernels,
    which these decoders never reach (every product is a GEMV, every SwiGLU swiglu_k)."""
    from onnxep.providers.ops import op_add, op_mat_mul, op_mul, op_sigmoid
    from onnxep.providers_cuda.ops import op_matmul_nbits, op_onnxep_matmul_nt
    from onnxep.providers_cuda.ops import op_onnxep_swiglu as cuda_swiglu

    install_mma(monkeypatch)
    monkeypatch.setattr(G, "NT_SMEM", HOST_NT_SMEM)
    emu.ALL_NAMES.setdefault(G.source(), G.GEMV_NT_NAMES)
    monkeypatch.setattr(op_onnxep_matmul_nt.op_add, "add", op_add.add)
    monkeypatch.setattr(op_onnxep_matmul_nt.op_mat_mul, "mat_mul", op_mat_mul.mat_mul)
    monkeypatch.setattr(cuda_swiglu.op_sigmoid, "sigmoid", op_sigmoid.sigmoid)
    monkeypatch.setattr(cuda_swiglu.op_mul, "mul", op_mul.mul)
    monkeypatch.setattr(op_matmul_nbits, "sm_count", lambda: emu.EMULATED_SMS)
    monkeypatch.setattr(op_matmul_nbits.K_, "module", no_old_kernels)
    seen: list[str] = []
    for cls in (G.GemvNT, M.NbitsMma):
        real = cls.emulated

        def counted(self, *args, _real=real):
            seen.append(args[1] if isinstance(self, G.GemvNT) else args[0])
            return _real(self, *args)

        monkeypatch.setattr(cls, "emulated", counted)
    return seen


def _normalising(name: str) -> bool:
    """Whether a launched instantiation has the norm prologue (gemv_nt's fifth template
    argument, nbits_mma's seventh)."""
    args = name[name.index("<") + 1 : -1].split(", ")
    return args[4 if name.startswith("gemv_nt") else 6] == "1"


def _session(path, off=()):
    options = onnxep.SessionOptions(disabled_rewrites=list(off))
    return onnxep.InferenceSession(str(path), options, providers=[NAME, "cpu"])


def _logits(sess):
    feeds = {}
    for arg in sess.get_inputs():
        if arg.name == "input_ids":
            feeds[arg.name] = PROMPT[None].astype(np.int64)
        elif arg.name == "attention_mask":
            feeds[arg.name] = np.ones((1, len(PROMPT)), np.int64)
        else:  # the empty past, in the cache's declared type
            shape = [1 if d == "batch_size" else 0 if isinstance(d, str) else d for d in arg.shape]
            dtype = np.float16 if "float16" in arg.type else np.float32
            feeds[arg.name] = np.zeros(shape, dtype)
    return sess.run(["logits"], feeds)[0]


@pytest.mark.parametrize("name", ["fp16", "int4-zp"])
def test_folded_norms_give_the_unfused_kernels_bits(models, launches, name):
    with emu.registered_for(NAME, OPS, standard_fusions):
        fused, plain = _session(models[name]), _session(models[name], off=FOLDS)
        assert fusion(fused, "fuse_norm_matmul", NAME).fired == 5  # 2 layers x 2 and the head
        if name.startswith("int4"):
            assert fusion(fused, "fuse_quantized_swiglu", NAME).fired == 2
        placed = {n.op_type: n.provider for n in fused.placement()}
        fold = "NormMatMulNT" if name == "fp16" else "NormMatMulNBits"
        assert placed[fold] == NAME and "SkipSimplifiedLayerNormalization" not in placed
        got = _logits(fused)
        normalising = [n for n in launches if _normalising(n)]
        assert len(normalising) == 5, launches
        launches.clear()
        want = _logits(plain)
        assert launches and not [n for n in launches if _normalising(n)]
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
        tokens = onnxep.generate(fused, PROMPT, 4, progress=False).tokens
        assert tokens == onnxep.generate(plain, PROMPT, 4, progress=False).tokens
