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

Kernels compile through ``nvrtc`` once per process, element type, head size
and tile shape (template arguments), at session creation when the head size is
known there, else when a signature is planned (before any capture: capture
follows warm-up runs). :func:`m_tiles` picks the tile shape of a call from its
shape and the SM count.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._flash_cuda import FLASH, FLASH_CTYPES, FLASH_SOURCE, MODE_ATTENTION, MODE_GQA, kernel_name
from ._reduce_cuda import all_aligned

_log = logging.getLogger("onnxep.cuda.attention")

#: Query rows per warp's m16 tile, warps per block and threads per block.
TILE_ROWS, WARPS, THREADS = 16, 4, 128
#: Query rows per block with one m16 tile per warp.
BQ = WARPS * TILE_ROWS
#: Largest head size whose warps hold two m16 tiles (their Q, scores and output fragments
#: twice over: 2 * (d/4 + 32 + d/2) registers, about 220 with addressing at 64).
MAX_TWO_TILE_HEAD = 64
#: Largest head size, and the step between sizes (one k16 step of the MMA).
MAX_HEAD_SIZE, HEAD_STEP = 256, 16
#: Compute capability the kernel needs: mma.sync m16n8k16 with fp16/bf16, cp.async (sm_80).
MIN_ARCH = 80
#: Shared memory a block gets without opting in (bytes).
DEFAULT_SMEM = 48 * 1024

FLASH_PATH, TILED_PATH = "flash", "tiled"


@dataclass(frozen=True)
class Geometry:
    """Tile shape of one head size: keys per tile, Q in registers, m16 tiles per warp, query
    rows per block, shared memory bytes."""

    d: int
    bk: int
    q_in_registers: bool
    m_tiles: int
    bq: int
    smem: int

    def describe(self) -> str:
        return f"{self.bq}-row query tiles ({self.m_tiles} m16 per warp) x {self.bk}-row key tiles"


def geometry(d: int, m_tiles: int = 1, itemsize: int = 2) -> Geometry:
    """Key tiles of 64 rows up to head size 128, where a warp's Q fragments (d/4 registers)
    fit beside the output's (d/2) and the scores' (32); beyond, 32-row key tiles and Q read
    from shared memory each step, so the accumulators keep their registers. Q's shared tile
    is V's buffer when it fits there (it moves to registers before V's first copy)."""
    if m_tiles not in (1, 2) or (m_tiles == 2 and d > MAX_TWO_TILE_HEAD):
        raise ValueError(f"{m_tiles} m16 tiles per warp at head size {d}")
    qreg = d <= 128
    bk = 64 if qreg else 32
    bq = BQ * m_tiles
    alias = qreg and bq <= bk
    rows = 2 * bk + (0 if alias else bq)  # K, V [, Q]
    return Geometry(d, bk, qreg, m_tiles, bq, rows * (d + 8) * itemsize)


def m_tiles(d: int, b: int, nh: int, sq: int, sms: int) -> int:
    """Two m16 tiles per warp where the head size leaves the registers and the blocks of
    twice the rows still fill every SM once; else one (more, smaller blocks)."""
    if d > MAX_TWO_TILE_HEAD:
        return 1
    blocks = -(-sq // (2 * BQ)) * nh * b
    return 2 if blocks >= sms else 1


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
    need = max(geometry(d, mt).smem for mt in (1, 2) if mt == 1 or d <= MAX_TWO_TILE_HEAD)
    if need > max(DEFAULT_SMEM, smem_optin):
        return Route(
            TILED_PATH, f"head size {d} needs {need} bytes of shared memory, the device "
            f"lets a block have {smem_optin}"
        )  # fmt: skip
    return Route(FLASH_PATH, f"tensor-core flash kernel: {name}, head size {d}")


_facts: dict[int, tuple[int, int]] = {}


def device_facts() -> tuple[int, int]:
    """(compute capability as major * 10 + minor, opt-in shared memory per block) of the
    current device, read once per device."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    facts = _facts.get(dev)
    if facts is None:
        device = cupy.cuda.Device(dev)
        arch = int(device.compute_capability)  # "90": major and minor digits
        facts = _facts[dev] = (arch, int(device.attributes["MaxSharedMemoryPerBlockOptin"]))
    return facts


class Kernels:
    """One node's view of the flash kernels: the device's facts, read once, and the
    instantiations it compiled."""

    def __init__(self, op: str) -> None:
        self.op = op
        self.arch, self.smem_optin = device_facts()
        self._fns: dict[tuple[str, int, int], Any] = {}

    def route(self, dtype: Any, d: int, dv: int | None = None) -> Route:
        return route(dtype, d, d if dv is None else dv, self.arch, self.smem_optin)

    def function(self, dtype: Any, geo: Geometry) -> Any:
        """The compiled instantiation for ``dtype`` and a tile shape (compiled once)."""
        from onnxep.providers_cuda import nvrtc

        name = np.dtype(dtype).name
        key = (name, geo.d, geo.m_tiles)
        fn = self._fns.get(key)
        if fn is None:
            inst = kernel_name(FLASH_CTYPES[name], geo.d, geo.bk, geo.q_in_registers, geo.m_tiles)
            fn = nvrtc.function(FLASH_SOURCE, inst, (inst,))
            if geo.smem > DEFAULT_SMEM:
                fn.max_dynamic_shared_size_bytes = geo.smem
            self._fns[key] = fn
        return fn

    def prepare(self, dtype: Any, d: int | None, dv: int | None = None) -> None:
        """Compile now (session creation) what a prefill of this dtype and head size may
        run: every tile shape its lengths choose between."""
        if dtype is None or d is None or not self.route(dtype, d, dv).flash:
            return
        for mt in (1, 2) if d <= MAX_TWO_TILE_HEAD else (1,):
            self.function(dtype, geometry(d, mt))


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
    sms: int = 1,
    tiles: int | None = None,
):
    """The launcher of one prefill: ``run(q, k, v, seqlens_k, q_seqlens, nonpad, mask_b,
    mask_f, mask_h, mask_t, sink, y) -> bool`` (False: an array is misaligned, nothing ran);
    its tile shape is ``run.geometry``: ``tiles`` m16 tiles per warp, or :func:`m_tiles`'
    choice for ``sms`` SMs.

    Strides are element strides (batch, head, row) of Q, K, V and Y (channels contiguous);
    ``sk`` is the keys K and V hold per (batch, head); mode 0 (GroupQueryAttention) reads
    each batch row's lengths from ``seqlens_k``/``q_seqlens`` and attends at most
    ``kv_limit`` keys, mode 1 (Attention) has ``past`` rows before the queries, or
    ``nonpad_kv_seqlen``'s. ``left``/``right``: window sizes (``pos - j <= left``,
    ``j - pos <= right``; -1 for none)."""
    geo = geometry(d, m_tiles(d, b, nh, sq, sms) if tiles is None else tiles)
    fn = kernels.function(dtype, geo)
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
    grid, block, smem = ((sq + geo.bq - 1) // geo.bq, nh, b), (THREADS,), geo.smem
    empty = b == 0 or sq == 0 or nh == 0  # nothing to compute

    def run(q, k, v, seqlens, qseq, nonpad, mask_b, mask_f, mask_h, mask_t, sink, y) -> bool:
        if empty:
            return True
        if not all_aligned((q, k, v)):
            return False
        fn(grid, block, (q, k, v, seqlens, qseq, nonpad, mask_b, mask_f, mask_h, mask_t, sink, y,
                         prm), shared_mem=smem)  # fmt: skip
        return True

    run.geometry = geo  # type: ignore[attr-defined]
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
    sms: int,
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
        kv_limit=kv_limit, mask_strides=bias_strides, smooth=cfg.smooth, sms=sms,
    )  # fmt: skip
    return Route(FLASH_PATH, f"{r.reason}, {run.geometry.describe()}"), run


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
    sms: int,
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
        mask_cols=None if mask is None else mask[3], sms=sms,
    )  # fmt: skip
    return Route(FLASH_PATH, f"{r.reason}, {run.geometry.describe()}"), run
