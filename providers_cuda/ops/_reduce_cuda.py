"""Launch planning and the builder shared by the Reduce* ops (CUDA C in ``_reduce_source``).

Numerics follow the CPU kernels (``providers/ops/_reduce.py``): float16 is
widened to float32 on load, every accumulation is float32, and the result is
rounded once on store (round to nearest even, as NumPy's ``astype``). Max and
Min let NaN win, as NumPy's do.

A reduction over any set of axes that form one contiguous run of a
C-contiguous array (size-1 dims ignored) is the middle axis of an
``(outer, n, inner)`` view of it. ``inner == 1`` runs ``reduce_rows`` (a warp
per short row, a block per long one, vectorised 16-byte loads where aligned);
``inner > 1`` runs ``reduce_cols`` (a block covers up to 32 consecutive
columns, coalesced, with its other threads down the reduced axis). When the
outputs alone cannot fill the device, each reduction is split across blocks
that leave float32 partials for ``reduce_finish``. Geometry comes from the
shapes and the device's SM count only.

Everything here imports without CuPy; :func:`compile_kernels` and
:func:`sm_count` are the only doors to the device, and every builder (here,
in ``op_softmax`` and ``_norm_cuda``) reaches them through this module's
attributes, so the tests' kernel emulator can stand in for both.
"""

from __future__ import annotations

import logging
import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxep.providers.ops._reduce import norm_axes

from ._attention_cuda import sm_count
from ._reduce_routing import LIBRARY, ReduceRoute, cub_enabled, route_reduction
from ._reduce_source import CTYPE, PRIMITIVES, REDUCE_BODY, REDUCE_KERNELS, reduce_names

WARP = 32
#: Threads of a block-per-row reduction, of a column tile and of the finishing pass.
BLOCK = 256
#: A launch with this many blocks per SM is taken to fill the device; split ones aim for twice.
FILL_PER_SM = 2
#: Fewest elements one thread of a split reduction should combine.
SPLIT_GRAIN = 16
MAX_GRID = 2**31 - 1
#: Launch plans a node keeps, one per input shape (then they are dropped and rebuilt).
MAX_PLANS = 64

_log = logging.getLogger("onnxep")


class PlanCache:
    """Launch plans by input key (shapes and dtypes), made on first sight by ``make(*key)``;
    at most MAX_PLANS are kept (a model fed ever-new shapes rebuilds them)."""

    def __init__(self, make: Callable[..., Any]) -> None:
        self._make = make
        self._plans: dict[tuple, Any] = {}

    def __call__(self, *key: Any) -> Any:
        plans = self._plans
        if key in plans:
            return plans[key]
        if len(plans) >= MAX_PLANS:
            plans.clear()
        plan = plans[key] = self._make(*key)
        return plan

    def prewarm(self, *key: Any) -> None:
        """Make the plan for ``key`` now, at build time, for statically known shapes; a shape
        the node cannot run is left for the run to report."""
        try:
            self(*key)
        except ValueError:
            self._plans.pop(key, None)


def static_meta(node: Any, i: int) -> tuple | None:
    """``(shape, dtype)`` of input ``i`` when both are known before the first run, else None."""
    v = node.inputs[i] if i < len(node.inputs) else None
    if v is None or v.dtype is None or v.static_shape is None:
        return None
    return (v.static_shape, np.dtype(v.dtype))


def static_metas(node: Any, slots: Sequence[int | None]) -> list[tuple | None] | None:
    """``static_meta`` of each input slot (None for a slot given as None or an omitted
    input); None when a given input's shape or dtype is not known statically."""
    out: list[tuple | None] = []
    for i in slots:
        if i is None or not node.has_input(i):
            out.append(None)
            continue
        meta = static_meta(node, i)
        if meta is None:
            return None
        out.append(meta)
    return out


def compile_kernels(body: str, names: Sequence[str]) -> dict[str, Any]:
    """``{name: kernel}`` for ``PRIMITIVES + body``, compiled once per process and device."""
    from onnxep.providers_cuda import nvrtc

    source = PRIMITIVES + body
    return {n: nvrtc.function(source, n, tuple(names)) for n in names}


def dtypes_for(node_dtype: Any) -> list[np.dtype]:
    """The dtypes to compile for: the declared one if the kernels take it, both when unknown."""
    if node_dtype is None:
        return list(CTYPE)
    dt = np.dtype(node_dtype)
    return [dt] if dt in CTYPE else []


def address(a: Any) -> int:
    """Where an array's first element lives (a host address for the emulator's NumPy arrays)."""
    if isinstance(a, np.ndarray):  # ml_dtypes arrays have no buffer view to ask
        return a.ctypes.data
    return a.data.ptr


def all_aligned(arrays: Sequence[Any]) -> bool:
    """Whether every array given (None skipped) starts on a 16-byte boundary."""
    for a in arrays:
        if a is not None and address(a) & 15:
            return False
    return True


#: A kernel's ``vec`` argument, indexed by whether vector loads may be used.
VEC_FLAGS = (np.int32(0), np.int32(1))


def contiguity_test(xp: Any) -> Callable[[Any], bool]:
    """The cheapest C-contiguity test ``xp``'s arrays offer (CuPy's ``flags`` builds an object
    per call; its arrays also carry a plain ``_c_contiguous`` attribute)."""
    probe = xp.empty(1)
    if isinstance(getattr(probe, "_c_contiguous", None), bool):
        return operator.attrgetter("_c_contiguous")
    return lambda a: a.flags.c_contiguous


def vector_width(dtype: np.dtype) -> int:
    return 16 // np.dtype(dtype).itemsize


def pow2_at_least(v: int) -> int:
    return 1 << max(0, int(v) - 1).bit_length()


def row_threads(n: int, per_thread: int = 8, cap: int = 1024) -> int:
    """Threads per row: a warp for short rows, else a power-of-two block giving each thread
    about ``per_thread`` elements (one or two vectors)."""
    return min(cap, max(WARP, pow2_at_least(-(-n // per_thread))))


def warp_rows_grid(rows: int) -> int:
    """Blocks of BLOCK threads for one warp per row."""
    return -(-rows // (BLOCK // WARP))


def split_layout(n: int, items: int, sms: int, grain: int, align: int) -> tuple[int, int]:
    """``(splits, chunk)`` for ``items`` reductions of ``n`` elements, one block each.

    Enough items fill the device alone; fewer are split so there are about
    ``2 * FILL_PER_SM`` blocks per SM, each split at least ``grain`` elements
    and a multiple of ``align`` (so vector loads stay aligned).
    """
    if n == 0 or items >= FILL_PER_SM * sms:
        return 1, n
    want = -(-(2 * FILL_PER_SM * sms) // max(items, 1))
    splits = min(want, n // grain)
    if splits <= 1:
        return 1, n
    chunk = -(-n // splits)
    chunk = -(-chunk // align) * align
    return -(-n // chunk), chunk


def reduce_view(shape: Sequence[int], axes: Sequence[int]) -> tuple[int, int, int] | None:
    """``(outer, n, inner)``: reducing ``axes`` of a C-contiguous ``shape`` is reducing the
    middle axis of that view. None when the reduced dims (size-1 dims aside) are not one
    contiguous run."""
    red = set(axes)
    runs: list[list[Any]] = []  # [reduced?, size] of maximal runs of like dims
    for k, d in enumerate(shape):
        if d == 1:
            continue
        r = k in red
        if runs and runs[-1][0] == r:
            runs[-1][1] *= d
        else:
            runs.append([r, d])
    kinds = [r for r, _ in runs]
    if kinds.count(True) > 1:
        return None
    if True not in kinds:
        return math.prod(shape), 1, 1  # every reduced dim has size 1
    at = kinds.index(True)
    outer = math.prod(s for _, s in runs[:at])
    inner = math.prod(s for _, s in runs[at + 1 :])
    return outer, runs[at][1], inner


@dataclass(frozen=True)
class ReducePlan:
    """One launch (two when split) of a reduction, for one input shape and dtype, with its
    scalar arguments built once."""

    out_shape: tuple[int, ...]
    kernel: str  # "reduce_rows", "reduce_cols", or "" when there are no outputs
    grid: tuple[int]
    block: tuple[int]
    args: tuple  # kernel arguments after (x, y, part); the rows kernel's vec flag follows
    vec: bool  # the rows kernel may use vector loads if x is aligned
    part_size: int  # float32 partials of a split reduction (0: not split)
    finish_grid: tuple[int] = (0,)
    finish_args: tuple = ()  # reduce_finish's arguments after (part, y)


def plan_reduce(
    shape: tuple[int, ...],
    dtype: np.dtype,
    axes: tuple[int, ...],
    keepdims: bool,
    sms: int,
) -> ReducePlan | None:
    """How to reduce normalised ``axes`` of a C-contiguous array; None: not one kernel's job."""
    ax = set(axes)
    if keepdims:
        out_shape = tuple(1 if k in ax else d for k, d in enumerate(shape))
    else:
        out_shape = tuple(d for k, d in enumerate(shape) if k not in ax)
    view = reduce_view(shape, axes)
    if view is None:
        return None
    outer, n, inner = view
    outputs = outer * inner
    if outputs == 0:
        return ReducePlan(out_shape, "", (0,), (0,), (), False, 0)
    i64, i32 = np.int64, np.int32
    if inner == 1:
        v = vector_width(dtype)
        if n <= BLOCK * 4:  # short rows: a warp each, several per block
            splits, chunk, tpr = 1, n, WARP
            grid, block = warp_rows_grid(outer), BLOCK
        else:
            splits, chunk = split_layout(n, outer, sms, BLOCK * SPLIT_GRAIN, v)
            tpr = block = BLOCK
            grid = outer * splits
        vec = n % v == 0 and chunk % v == 0
        args = (i64(outer), i64(n), i64(chunk), i32(splits), i32(tpr))
        kernel = "reduce_rows"
    else:
        tx = min(WARP, pow2_at_least(inner))
        ty = BLOCK // tx
        blocks = outer * -(-inner // tx)
        splits, chunk = split_layout(n, blocks, sms, ty * SPLIT_GRAIN, 1)
        grid, block, vec = blocks * splits, BLOCK, False
        args = (i64(outer), i64(n), i64(inner), i64(chunk), i32(splits), i32(tx.bit_length() - 1))
        kernel = "reduce_cols"
    if grid > MAX_GRID:
        return None
    if splits == 1:
        return ReducePlan(out_shape, kernel, (grid,), (block,), args, vec, 0)
    finish = (i64(outputs), i32(splits), i64(n))
    return ReducePlan(out_shape, kernel, (grid,), (block,), args, vec, outputs * splits,
                      (warp_rows_grid(outputs),), finish)  # fmt: skip


@dataclass(frozen=True)
class LibraryPlan:
    """A ReduceSum/ReduceMean routed to CuPy's CUB reduction (``_reduce_routing``): the whole
    array reduces to one output."""

    out_shape: tuple[int, ...]
    n: int  # elements reduced
    mean: bool


def run_library(plan: LibraryPlan, x: Any, xp: Any) -> Any:
    """``cupy.sum`` of the C-contiguous ``x`` as one flat run (CUB's ``DeviceReduce``, float32
    accumulation), divided by the count for a mean as our kernel does (``acc / n``)."""
    s = xp.sum(x.reshape(-1))
    if plan.mean:
        s = s / np.float32(plan.n)
    return s.reshape(plan.out_shape)


def route_for(view: tuple[int, int, int], dtype: np.dtype, sms: int, library: bool) -> ReduceRoute:
    """The routing rule (``_reduce_routing``) with this module's block size, grain and fill."""
    outer, n, inner = view
    return route_reduction(outer * inner, n, dtype, sms, library=library, threads=BLOCK,
                           grain=SPLIT_GRAIN, fill_per_sm=FILL_PER_SM)  # fmt: skip


def run_reduce(plan: ReducePlan, fns: dict[str, Any], x: Any, xp: Any) -> Any:
    """Launch ``plan`` on the C-contiguous ``x``; returns the output array (no host wait)."""
    y = xp.empty(plan.out_shape, x.dtype)
    if not plan.kernel:
        return y
    part = xp.empty(plan.part_size, np.float32) if plan.part_size else None
    if plan.kernel == "reduce_rows":
        vec = VEC_FLAGS[plan.vec and address(x) & 15 == 0]
        fns["reduce_rows"](plan.grid, plan.block, (x, y, part, *plan.args, vec))
    else:
        fns["reduce_cols"](plan.grid, plan.block, (x, y, part, *plan.args))
    if part is not None:
        fns["reduce_finish"](plan.finish_grid, (BLOCK,), (part, y, *plan.finish_args))
    return y


# --------------------------------------------------------------------------- the Reduce* builder

#: What a Reduce* node's axes are at build time, when not a tuple of axes.
ALL_AXES = "all"
NO_REDUCTION = "noop"
RUN_TIME = "run time"


def static_axes(node: Any, axes_input_since: int) -> tuple[int, ...] | str:
    """The node's axes as written (not yet normalised), ALL_AXES, NO_REDUCTION, or RUN_TIME
    when they come from a non-constant input."""
    if node.opset < axes_input_since:
        attr = node.attr("axes", None)
        return tuple(int(a) for a in attr) if attr else ALL_AXES
    vals: list[int] = []
    if node.has_input(1):
        const = node.const_input(1)
        if const is None:
            return RUN_TIME
        vals = [int(v) for v in np.asarray(const).reshape(-1).tolist()]
    if not vals:
        return NO_REDUCTION if node.attr("noop_with_empty_axes", 0) else ALL_AXES
    return tuple(vals)


Builder = Callable[[Any, Any], Callable[..., tuple]]


def build_reduce(
    node: Any, xp: Any, kind: str, axes_input_since: int, generic: Builder
) -> Callable[..., tuple]:
    """A Reduce* node as one kernel (two when split) for float32/float16 over one run of axes.

    Everything else runs the generic kernel on the device: other dtypes, axes
    that come from a non-constant input (host values, known only per run),
    no reduction at all (noop_with_empty_axes), axes that are not one
    contiguous run, and strided inputs' shapes the kernels cannot view.
    """
    fallback = generic(node, xp)
    axes = static_axes(node, axes_input_since)
    dtypes = dtypes_for(node.input_dtype(0))
    if axes in (RUN_TIME, NO_REDUCTION) or not dtypes:
        return fallback
    keep = bool(node.attr("keepdims", 1))
    fns_by_dtype = {}
    for dt in dtypes:
        names = reduce_names(kind, (CTYPE[dt],))
        compiled = compile_kernels(REDUCE_BODY, names)
        fns_by_dtype[dt] = {k: compiled[n] for k, n in zip(REDUCE_KERNELS, names, strict=True)}
    sms = sm_count()
    op = node.op_type
    # ReduceSum/ReduceMean choose between our kernel and CuPy's CUB by parallelism; the
    # route each input signature took is kept on the kernel (``run.routes``) for reports.
    routed = kind in ("sum", "mean")
    library = routed and cub_enabled()
    routes: dict[tuple, ReduceRoute] = {}

    def plan_for(shape: tuple[int, ...], dtype: np.dtype) -> ReducePlan | LibraryPlan | None:
        if dtype not in fns_by_dtype:
            return None
        ax = tuple(range(len(shape))) if axes == ALL_AXES else norm_axes(axes, len(shape), op)
        view = reduce_view(shape, ax) if routed else None
        if view is not None:
            route = routes[shape, np.dtype(dtype)] = route_for(view, dtype, sms, library)
            _log.debug("%s %s %s: %s", op, node.name, shape, route.describe())
            if route.path == LIBRARY:
                out = tuple(1 if k in ax else d for k, d in enumerate(shape) if keep or k not in ax)
                return LibraryPlan(out, view[1], kind == "mean")
        return plan_reduce(shape, dtype, ax, keep, sms)

    plans = PlanCache(plan_for)
    if (meta := static_meta(node, 0)) is not None:
        plans.prewarm(*meta)
    contiguous = contiguity_test(xp)

    def run(x: Any, axes_in: Any = None) -> tuple:
        plan = plans(x.shape, x.dtype)
        if plan is None:
            return fallback(x, axes_in)
        if not contiguous(x):
            x = xp.ascontiguousarray(x)
        if type(plan) is LibraryPlan:
            return (run_library(plan, x, xp),)
        return (run_reduce(plan, fns_by_dtype[x.dtype], x, xp),)

    run.routes = routes  # type: ignore[attr-defined]
    return run
