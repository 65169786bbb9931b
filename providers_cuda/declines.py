"""What the CUDA provider declines, and why: read by the provider and, without CuPy, by CI.

The provider's kernels are the generic library plus ``providers_cuda/ops``;
the ops below are declined whole, dtypes CuPy lacks are declined per node,
and non-tensor values (sequences, optionals, maps) stay on the host. If,
Loop and Scan are claimed: their values cross in host memory while their
bodies' nodes are placed on the GPU. ``claimed_ops()`` derives the claimed
op set from these tables and the op modules alone, so a CI test without a
GPU can check that every claimed op has a parity case.
"""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import numpy as np

#: (domain, op_type) -> why the CUDA provider never runs it.
DECLINED_OPS: dict[tuple[str, str], str] = {
    **{
        ("", op): (
            f"{op}: random; CuPy's generator cannot reproduce NumPy's seeded stream, "
            "so the CPU provider runs it and seeded results stay reproducible"
        )
        for op in (
            "Bernoulli",
            "Multinomial",
            "RandomNormal",
            "RandomNormalLike",
            "RandomUniform",
            "RandomUniformLike",
        )
    },
    **{
        ("", op): f"{op}: sequences stay on the host (a Python list of arrays, not a tensor)"
        for op in (
            "ConcatFromSequence",
            "SequenceAt",
            "SequenceConstruct",
            "SequenceEmpty",
            "SequenceErase",
            "SequenceInsert",
            "SequenceLength",
            "SequenceMap",
            "SplitToSequence",
        )
    },
    **{
        ("", op): f"{op}: optional values stay on the host"
        for op in ("Optional", "OptionalGetElement", "OptionalHasElement")
    },
    ("ai.onnx.preview", "FlexAttention"): (
        "FlexAttention: its score and mask functions are subgraphs run per element on the host"
    ),
}

#: Control flow the provider claims (providers_cuda/ops/op_if.py...): host orchestration,
#: bodies placed like any graph. Other ops with subgraphs are declined.
CONTROL_FLOW = frozenset({("", "If"), ("", "Loop"), ("", "Scan")})

#: Why a dtype is declined (the ONNX type name as ``dtype_name`` gives it).
DECLINED_DTYPES: dict[str, str] = {
    "bfloat16": "bfloat16 is declined for now: CuPy has no bfloat16 dtype",
    "string": "strings stay on the host: CuPy has no string dtype",
}
#: The rest of what CuPy lacks: narrow floats and sub-byte integers (ml_dtypes types).
_NARROW_PREFIXES = ("float8", "float4", "float6", "int4", "uint4", "int2", "uint2")

#: Ops whose generic kernels call CuPy's cuBLAS wrappers (matmul, tensordot,
#: einsum, linalg), which refuse inside stream capture; the provider marks
#: them not capture-safe unless one of its own kernels overrides them.
CUPY_BLAS_OPS: frozenset[tuple[str, str]] = frozenset(
    {
        ("", "Conv"),
        ("", "ConvInteger"),
        ("", "ConvTranspose"),
        ("", "DeformConv"),
        ("", "Det"),
        ("", "Einsum"),
        ("", "LinearAttention"),
        ("", "MatMulInteger"),
        ("", "QLinearConv"),
        ("", "QLinearMatMul"),
        ("", "STFT"),
        ("", "DFT"),
        ("", "RoiAlign"),
        ("", "AffineGrid"),
        ("com.microsoft", "Attention"),
        ("com.microsoft", "FusedMatMul"),
        ("com.microsoft", "LinearAttention"),
        ("com.microsoft", "MultiHeadAttention"),
        ("com.microsoft", "MatMulNBits"),
        ("com.microsoft", "GroupQueryAttention"),
    }
)
CUPY_BLAS_NOTE = (
    "its generic kernel calls CuPy's cuBLAS or cuFFT wrappers, which refuse inside stream capture"
)


def dtype_refusal(dtype: np.dtype | None) -> str | None:
    """Why a tensor of ``dtype`` cannot live on the device, or None."""
    if dtype is None:
        return None
    from onnxep.providers.dtypes import dtype_name

    try:
        name = dtype_name(dtype)
    except ValueError:
        return f"dtype {dtype} has no ONNX type"
    if name in DECLINED_DTYPES:
        return DECLINED_DTYPES[name]
    if name.startswith(_NARROW_PREFIXES) or dtype.kind not in "biufc":
        return f"{name} is not a CuPy dtype"
    return None


# -- the claimed op set, derived statically ---------------------------------------------

_ROOT = Path(__file__).resolve().parent


def _kernel_ops(folder: Path) -> set[tuple[str, str]]:
    """``(domain, op_type)`` of every ``@kernel(...)`` in the ``op_*`` modules of ``folder``."""
    out: set[tuple[str, str]] = set()
    for info in pkgutil.iter_modules([str(folder)]):
        if not info.name.startswith("op_"):
            continue
        tree = ast.parse((folder / f"{info.name}.py").read_text())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "kernel"):
                continue
            if not node.args or not isinstance(node.args[0], ast.Constant):
                continue
            domain = ""
            for kw in node.keywords:
                if kw.arg == "domain" and isinstance(kw.value, ast.Constant):
                    domain = "" if kw.value.value in ("", "ai.onnx") else kw.value.value
            out.add((domain, node.args[0].value))
    return out


def claimed_ops() -> set[tuple[str, str]]:
    """Every op the CUDA provider has a kernel for and does not decline outright."""
    generic = _ROOT.parent / "providers" / "ops"
    if not generic.is_dir():  # installed: the generic library is a sibling package
        import onnxep.providers.ops as pkg

        generic = Path(pkg.__path__[0])
    ops = _kernel_ops(generic) | _kernel_ops(_ROOT / "ops")
    return {op for op in ops if op not in DECLINED_OPS}
