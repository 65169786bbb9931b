"""The tensor-core attention prefill (``_flash_cuda``): its geometry, its route and its launch.

:func:`route` decides, from the dtype, the head sizes and the device's compute
capability and opt-in shared memory (never from a model's name or size),
whether a prefill runs the tensor-core kernel or the scalar tiled kernels it
replaces, and says why; the op modules keep each signature's route on the
kernel (``run.routes``) and log it at debug level. :func:`plan` writes one
call's scalars into a parameter block once, and returns the launcher the
step calls; a launcher declines (returns False) only when an array does not
start on a 16-byte boundary, which the 16-byte copies need, and the caller
then runs the scalar kernel.

Kernels compile through ``nvrtc`` once per process, element type and head
size (a template argument), at session creation when the head size is known
there, else when a signature is planned (before any capture: capture follows
warm-up runs).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._flash_cuda import FLASH, FLASH_CTYPES, FLASH_SOURCE, MODE_ATTENTION, MODE_GQA, kernel_name
from ._reduce_cuda import all_aligned

_log = logging.getLogger("onnxep.cuda.attention")

#: Query rows per block (4 warps of 16) and threads per block.
BQ, THREADS = 64, 128
#: Largest head size, and the step between sizes (one k16 step of the MMA).
MAX_HEAD_SIZE, HEAD_STEP = 256, 16
#: Compute capability the kernel needs: mma.sync m16n8k16 with fp16/bf16, cp.async (sm_80).
MIN_ARCH = 80
#: Shared memory a block gets without opting in (bytes).
DEFAULT_SMEM = 48 * 1024

FLASH_PATH, TILED_PATH = "flash", "tiled"


@dataclass(frozen=True)
class Geometry:
    """Tile shape of one head size: keys per tile, Q in registers, shared memory bytes."""

    d: int
    bk: int
    q_in_registers: bool
    smem: int


def geometry(d: int, itemsize: int = 2) -> Geometry:
    """Key tiles of 64 rows up to head size 128, where a warp's Q fragments (d/4 registers)
    fit beside the output's (d/2) and the scores' (32); beyond, 32-row key tiles and Q read
    from shared memory each step, so the accumulators keep their registers."""
    qreg = d <= 128
    bk = 64 if qreg else 32
    rows = bk + max(bk, BQ) if qreg else 2 * bk + BQ  # K, then V (Q's buffer first) [, Q]
    return Geometry(d, bk, qreg, rows * (d + 8) * itemsize)


@dataclass(frozen=True)
class Route:
    """Which prefill kernel a signature runs, and why (as the kernel's note shows it)."""

    path: str  # FLASH_PATH or TILED_PATH
    reason: str

    @property
    def flash(self) -> bool:
        return self.path == FLASH_PATH


def route(dtype: Any, d: int, dv: int, arch: int, smem_optin: int) -> Route:
    """The kernel for a prefill of ``dtype`` with Q/K head size ``d`` and V's ``dv`` on a
    device of compute capability ``arch`` (major * 10 + minor) that lets a block opt in to
    ``smem_optin`` bytes of shared memory."""
    name = np.dtype(dtype).name
    if name not in FLASH_CTYPES:
        return Route(TILED_PATH, f"{name}: tensor cores take float16 and bfloat16 here")
    if arch < MIN_ARCH:
        return Route(
            TILED_PATH,
            f"compute capability {arch // 10}.{arch % 10} lacks the m16n8k16 tensor-core MMA "
            f"(needs {MIN_ARCH // 10}.{MIN_ARCH % 10})",
        )
    if dv != d:
        return Route(TILED_PATH, f"V's head size {dv} differs from Q and K's {d}")
    if d % HEAD_STEP or not 0 < d <= MAX_HEAD_SIZE:
        return Route(
            TILED_PATH,
            f"head size {d} is not a multiple of {HEAD_STEP} up to {MAX_HEAD_SIZE}",
        )
    geo = geometry(d)
    if geo.smem > max(DEFAULT_SMEM, smem_optin):
        return Route(
            TILED_PATH, f"head size {d} needs {geo.smem} bytes of shared memory, the device "
            f"lets a block have {smem_optin}"
        )  # fmt: skip
    return Route(
        FLASH_PATH,
        f"tensor-core flash kernel: {name}, head size {d}, {BQ}-row query tiles x "
        f"{geo.bk}-row key tiles",
    )


_facts: dict[int, tuple[int, int]] = {}


def device_facts() -> tuple[int, int]:
    """(compute capability as major * 10 + minor, opt-in shared memory per block) of the
    current device, read once per device."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    facts = _facts.get(dev)
    if facts is None:
        attrs = cupy.cuda.Device(dev).attributes
        arch = 10 * attrs["ComputeCapabilityMajor"] + attrs["ComputeCapabilityMinor"]
        facts = _facts[dev] = (arch, int(attrs["MaxSharedMemoryPerBlockOptin"]))
    return facts


class Kernels:
    """One node's view of the flash kernels: the device's facts, read once, and the
    instantiations it compiled."""

    def __init__(self, op: str) -> None:
        self.op = op
        self.arch, self.smem_optin = device_facts()
        self._fns: dict[tuple[str, int], Any] = {}

    def route(self, dtype: Any, d: int, dv: int | None = None) -> Route:
        return route(dtype, d, d if dv is None else dv, self.arch, self.smem_optin)

    def function(self, dtype: Any, d: int) -> Any:
        """The compiled instantiation for ``dtype`` and head size ``d`` (compiled once)."""
        from onnxep.providers_cuda import nvrtc

        name = np.dtype(dtype).name
        fn = self._fns.get((name, d))
        if fn is None:
            geo = geometry(d)
            inst = kernel_name(FLASH_CTYPES[name], d, geo.bk, geo.q_in_registers)
            fn = nvrtc.function(FLASH_SOURCE, inst, (inst,))
            if geo.smem > DEFAULT_SMEM:
                fn.max_dynamic_shared_size_bytes = geo.smem
            self._fns[(name, d)] = fn
        return fn

    def prepare(self, dtype: Any, d: int | None, dv: int | None = None) -> None:
        """Compile now (session creation) what a prefill of this dtype and head size runs."""
        if dtype is not None and d is not None and self.route(dtype, d, dv).flash:
            self.function(dtype, d)


def plan(
    kernels: Kernels,
    xp: Any,
    dtype: Any,
    *,
    b: int,
    nh: int,
    nkv: int,
    d: int,
    sq: int,
    sk: int,
    q_strides: tuple[int, int, int],
    k_strides: tuple[int, int, int],
    v_strides: tuple[int, int, int],
    y_strides: tuple[int, int, int],
    mode: int,
    causal: bool,
    scale: float,
    softcap: float = 0.0,
    left: int = -1,
    right: int = -1,
    kv_limit: int = 0,
    past: int = 0,
    nonpad_offset: bool = False,
    mask_strides: tuple[int, int, int, int] = (0, 0, 0, 0),
    mask_cols: int | None = None,
    smooth: bool = False,
):
    """The launcher of one prefill: ``run(q, k, v, seqlens_k, q_seqlens, nonpad, mask_b,
    mask_f, mask_h, mask_t, sink, y) -> bool`` (False: an array is misaligned, nothing ran).

    Strides are element strides (batch, head, row) of Q, K, V and Y (channels contiguous);
    ``sk`` is the keys K and V hold per (batch, head); mode 0 (GroupQueryAttention) reads
    each batch row's lengths from ``seqlens_k``/``q_seqlens`` and attends at most
    ``kv_limit`` keys, mode 1 (Attention) has ``past`` rows before the queries, or
    ``nonpad_kv_seqlen``'s. ``left``/``right``: window sizes (``pos - j <= left``,
    ``j - pos <= right``; -1 for none)."""
    fn = kernels.function(dtype, d)
    geo = geometry(d)
    strides = (*q_strides, *k_strides, *v_strides, *y_strides)
    if any(st % 8 for st in strides):  # rows of 16 bytes: every stride a multiple of 8
        raise ValueError(f"{kernels.op}: flash strides {strides} are not multiples of 8")
    prm = FLASH.to_device(
        xp, qsb=q_strides[0], qsh=q_strides[1], qss=q_strides[2],
        ksb=k_strides[0], ksh=k_strides[1], kss=k_strides[2],
        vsb=v_strides[0], vsh=v_strides[1], vss=v_strides[2],
        ysb=y_strides[0], ysh=y_strides[1], yss=y_strides[2],
        msb=mask_strides[0], msh=mask_strides[1], mss=mask_strides[2], msj=mask_strides[3],
        past=past, Sq=sq, Sk=sk, nh=nh, nkv=nkv, kv_limit=kv_limit, causal=int(causal),
        left=left, right=right, mask_cols=sk if mask_cols is None else mask_cols, mode=mode,
        nonpad_offset=int(nonpad_offset), smooth=int(smooth), scale=scale, softcap=softcap,
    )  # fmt: skip
    grid, block, smem = ((sq + BQ - 1) // BQ, nh, b), (THREADS,), geo.smem
    if b == 0 or sq == 0 or nh == 0:
        return lambda *arrays: True  # nothing to compute

    def run(q, k, v, seqlens, qseq, nonpad, mask_b, mask_f, mask_h, mask_t, sink, y) -> bool:
        if not all_aligned((q, k, v)):
            return False
        fn(grid, block, (q, k, v, seqlens, qseq, nonpad, mask_b, mask_f, mask_h, mask_t, sink, y,
                         prm), shared_mem=smem)  # fmt: skip
        return True

    return run


def log_route(op: str, node: str, sig: Any, r: Route) -> None:
    _log.debug("%s %s %s: %s", op, node, sig, r.reason)


def plan_gqa(
    kernels: Kernels,
    xp: Any,
    dtype: Any,
    cfg: Any,
    *,
    b: int,
    s: int,
    d: int,
    cap: int,
    kv_limit: int,
    bias_strides: tuple[int, int, int, int],
    scale: float,
):
    """(route, launcher or None) of a GroupQueryAttention prefill: Q from gqa_prepare's
    (B, Hq, S, D) buffer, K/V from the (B, Hkv, cap, D) cache, Y as (B, S, Hq * D); the
    bias is the kernel's ``mask_t``."""  # fmt: skip
    r = kernels.route(dtype, d)
    if r.flash and cfg.window == 0:
        r = Route(TILED_PATH, "local_window_size 0 attends no key")
    if not r.flash:
        return r, None
    nh, nkv = cfg.num_heads, cfg.kv_num_heads
    kv = (nkv * cap * d, cap * d, d)
    run = plan(
        kernels, xp, dtype, b=b, nh=nh, nkv=nkv, d=d, sq=s, sk=cap,
        q_strides=(nh * s * d, s * d, d), k_strides=kv, v_strides=kv,
        y_strides=(s * nh * d, d, nh * d), mode=MODE_GQA, causal=cfg.causal, scale=scale,
        softcap=cfg.softcap, left=cfg.window - 1 if cfg.window > 0 else -1,
        kv_limit=kv_limit, mask_strides=bias_strides, smooth=cfg.smooth,
    )  # fmt: skip
    return r, run


def plan_attention(
    kernels: Kernels,
    xp: Any,
    dtype: Any,
    cfg: Any,
    *,
    b: int,
    hq: int,
    hkv: int,
    d: int,
    dv: int,
    sq: int,
    total: int,
    past: int,
    split: int,
    strides: tuple,
    mask: tuple[int, int, int, int] | None,
    nonpad_offset: bool,
    scale: float,
):
    """(route, launcher or None) of an ONNX Attention call: ``strides`` are Q's, K's, V's
    and Y's (batch, head, row) element strides; ``mask`` the mask's (batch, head, row)
    strides and its columns; ``split`` the key splits the tiled kernel would use: the
    tensor-core kernel does not split keys, so a call the tiled kernel splits (a few query
    rows over many keys: the query tiles leave the device idle) stays there."""  # fmt: skip
    r = kernels.route(dtype, d, dv)
    if r.flash and split > 1:
        r = Route(TILED_PATH, f"{sq} query rows over {total} keys: the tiled kernel splits "
                              f"the keys {split} ways")  # fmt: skip
    if not r.flash:
        return r, None
    qs, ks, vs, ys = strides
    run = plan(
        kernels, xp, dtype, b=b, nh=hq, nkv=hkv, d=d, sq=sq, sk=total, q_strides=qs,
        k_strides=ks, v_strides=vs, y_strides=ys, mode=MODE_ATTENTION, causal=cfg.causal,
        scale=scale, softcap=cfg.softcap, left=cfg.left, right=cfg.right, past=past,
        nonpad_offset=nonpad_offset,
        mask_strides=(0, 0, 0, 0) if mask is None else (*mask[:3], 1),
        mask_cols=None if mask is None else mask[3],
    )  # fmt: skip
    return r, run
