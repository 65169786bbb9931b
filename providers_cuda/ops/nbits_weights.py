"""MatMulNBits' constant inputs, checked and laid out as the CUDA kernels read them.

The session uploads every constant a device node consumes, so where the
kernels can read that copy as it is (B's rows already whole 16-byte chunks,
scales of the right width, packed zero points) they use it and nothing is
uploaded twice; otherwise a repacked copy is uploaded here, at session
creation. ``nbits_cuda`` describes the layout.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.node import NodeInfo

from . import nbits_cuda as K_
from .reduce_cuda import address


def fail(why: str) -> NotSupported:
    return NotSupported(f"MatMulNBits: {why}")


def _const(node: NodeInfo, i: int, what: str) -> np.ndarray | None:
    """Input ``i`` as a NumPy array (None when omitted); decline when it is computed at run time."""
    if not node.has_input(i):
        return None
    v = node.const_input(i)
    if v is None:
        raise fail(
            f"{what} (input {i}) must be a constant initializer on CUDA, where it is repacked "
            "once at session creation; this node computes it at run time"
        )
    return np.asarray(v)


class Table:
    """One constant table on the device.

    ``natural``: the session's device copy of the input, viewed as ``shape``,
    is what the kernels read, so :meth:`get` adopts it on the first run (a
    view, no copy) and afterwards only compares identities. Otherwise (or when
    that copy is missing or misaligned) the ``host`` layout is uploaded: at
    build time when it differs from the input's.
    """

    def __init__(self, host: np.ndarray, natural: bool, xp: Any) -> None:
        self.host = host
        self.xp = xp
        self.natural = natural
        self.src: Any = None
        self.dev: Any = None
        self.uploaded: Any = None
        if not natural:
            self.upload()

    def upload(self) -> Any:
        if self.uploaded is None:
            self.uploaded = self.xp.asarray(self.host)
        return self.uploaded

    def get(self, arg: Any) -> Any:
        if arg is not None and arg is self.src:
            return self.dev
        if (
            self.natural
            and arg is not None
            and arg.dtype == self.host.dtype
            and arg.size == self.host.size
            and arg.flags.c_contiguous
            and address(arg) % 16 == 0
        ):
            self.dev = arg.reshape(self.host.shape)
            self.src = arg
            return self.dev
        return self.upload()


class Weights:
    """B, scales and zero points checked against K, N, bits and block_size."""

    def __init__(self, node: NodeInfo, k: int, n: int, bits: int, block: int, xp: Any) -> None:
        self.k, self.n, self.bits, self.block = k, n, bits, block
        self.xp = xp
        self.kb = -(-k // block)
        blob = block * bits // 8
        b = _const(node, 1, "B")
        scales = _const(node, 2, "scales")
        zp = _const(node, 3, "zero_points")
        self._check_g_idx(_const(node, 4, "g_idx"))
        if b is None or scales is None:
            raise fail("B and scales are required inputs")
        self.empty = b.size == 0
        if self.empty:
            return
        if b.dtype != np.uint8 or b.size != n * self.kb * blob:
            raise fail(
                f"B must hold N * ceil(K / block_size) * block_size * bits / 8 = "
                f"{n * self.kb * blob} uint8 bytes (shape ({n}, {self.kb}, {blob})), got "
                f"{b.dtype} {tuple(b.shape)}"
            )
        self.chunks = -(-k // (128 // bits))
        self.rs = 16 * self.chunks
        rows = b.reshape(n, self.kb * blob)
        if rows.shape[1] == self.rs:
            self.b = Table(rows, True, xp)
        else:
            # Rows cut or zero-padded to whole 16-byte chunks: the GEMV reads them with
            # 16-byte loads, and bytes past the chunk holding K's last value are never needed.
            keep = min(self.rs, rows.shape[1])
            packed = np.zeros((n, self.rs), np.uint8)
            packed[:, :keep] = rows[:, :keep]
            self.b = Table(packed, False, xp)
        self.scales = self._scales(scales)
        self.zp_kind, self.zp8, self.zpf, self.zs = K_.ZP_NONE, None, None, 1
        if zp is not None:
            self._zero_points(zp)

    def _scales(self, scales: np.ndarray) -> Table:
        s = scales.reshape(self.n, -1)
        if s.shape[1] < self.kb:
            raise fail(f"scales has {s.shape[1]} entries per row, need ceil(K/block)={self.kb}")
        if s.dtype in (np.float16, np.float32) and s.shape[1] == self.kb:
            return Table(s, True, self.xp)
        s = s[:, : self.kb]
        if s.dtype not in (np.float16, np.float32):
            s = s.astype(np.float32)  # bfloat16 and float64 scales: float32, as the CPU does
        return Table(np.ascontiguousarray(s), False, self.xp)

    def _zero_points(self, zp: np.ndarray) -> None:
        z = zp.reshape(self.n, -1)
        if z.dtype == np.uint8:
            if z.shape[1] * (8 // self.bits) < self.kb:
                raise fail(
                    f"packed zero_points hold {z.shape[1] * (8 // self.bits)} values per row, "
                    f"need ceil(K/block)={self.kb}"
                )
            self.zp_kind, self.zs = K_.ZP_PACKED, z.shape[1]
            self.zp8 = Table(z, True, self.xp)
            return
        if z.shape[1] < self.kb:
            raise fail(f"zero_points has {z.shape[1]} per row, need ceil(K/block)={self.kb}")
        self.zp_kind = K_.ZP_FLOAT
        if z.dtype == np.float32 and z.shape[1] == self.kb:
            self.zpf = Table(z, True, self.xp)
        else:
            self.zpf = Table(
                np.ascontiguousarray(z[:, : self.kb].astype(np.float32)), False, self.xp
            )

    def _check_g_idx(self, g_idx: np.ndarray | None) -> None:
        if g_idx is None:
            return
        natural = np.arange(self.k) // self.block
        gi = g_idx.reshape(-1)
        if gi.shape[0] < self.k or not np.array_equal(gi[: self.k], natural):
            raise fail(
                "a g_idx that reorders quantization groups is not supported on CUDA (only "
                "g_idx[k] == k // block_size, the default order); the CPU provider runs it"
            )
