"""onnxep::MatMulNBits on CUDA: MatMulNBits with its SwiGLU in the tensor-core GEMV's epilogue.

Rows the tensor-core GEMV takes (``nbits_mma_cuda``: 4-bit weights, float16 A or float32
A rounded to int8, up to 8 rows) run one launch that writes ``silu(gate) * up`` rounded
where the unfused MatMulNBits and SwiGLU nodes round; anything else runs com.microsoft
MatMulNBits's CUDA kernel, then onnxep::SwiGLU's, as the unfused nodes did.
"""

from __future__ import annotations

from typing import Any

from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.op_onnxep_matmul_nbits import check_swiglu, plain_node
from onnxep.providers.ops.op_onnxep_matmul_nt import activation

from . import nbits_mma_cuda as MMA
from . import op_matmul_nbits, op_onnxep_swiglu
from .norm_fold import rows_of


@kernel("MatMulNBits", domain="onnxep", dtypes=("float", "float16"), capture_safe=True)
def matmul_nbits(node: NodeInfo, xp: Any):
    base = op_matmul_nbits.matmul_nbits(plain_node(node), xp)
    if activation(node) == "none":
        return base
    check_swiglu(node)
    return SwiGLURunner(node, base, xp)


class SwiGLURunner:
    """A MatMulNBits runner's product, then the SwiGLU of its gate and up halves."""

    def __init__(self, node: NodeInfo, base: Any, xp: Any) -> None:
        self.base, self.xp = base, xp
        self.glu = op_onnxep_swiglu.swiglu(node, xp)
        mma = getattr(base, "mma", None)
        self.mma = None
        if mma is not None:
            w = base.w
            self.mma = MMA.NbitsMma(
                xp, base.a_dtype, w.scales.host.dtype, w.zp_kind, w.block, q8=mma.q8, swiglu=True
            )

    def takes(self, a: Any) -> bool:
        """Whether ``a``'s rows run the one-launch GEMV with the SwiGLU in its epilogue."""
        return (
            self.mma is not None
            and a.dtype == self.base.a_dtype
            and a.ndim >= 1
            and a.shape[-1] == self.base.k
            and self.mma.fits(rows_of(a), self.base.w.chunks, self.base.w.kb)
        )

    def __call__(self, a, b=None, scales=None, zero_points=None, g_idx=None, bias=None):
        if not self.takes(a):
            return self.glu(self.base(a, b, scales, zero_points, g_idx, bias)[0])
        base = self.base
        m, h = rows_of(a), base.n // 2
        a2 = self.xp.ascontiguousarray(a).reshape(m, base.k)
        tables = base.tables(b, scales, zero_points)[:3]
        y = self.mma(a2, m, h, base.k, tables, base.layout, base.bias_for(bias))
        return (y.reshape(a.shape[:-1] + (h,)),)
