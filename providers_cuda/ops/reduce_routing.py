"""Which path a ReduceSum/ReduceMean takes on CUDA: our block-reduction kernel or CuPy's CUB.

A pure function of the output count, the group size (elements reduced into
each output), the dtype and the device's SM count, so it is tested on the CPU
(tests/test_reduce_routing.py). The rule is parallelism alone:

- the outputs fill the device (at least ``fill_per_sm`` blocks per SM, one
  output per block), or each group is small (one block covers it with at most
  ``grain`` elements per thread): our kernel, one launch, one block or warp
  per output;
- otherwise (few outputs over huge groups) one output must be spread over
  many blocks. CUB's ``DeviceReduce`` (what ``cupy.sum`` runs when CuPy's CUB
  accelerator is on) does that for a whole-array reduction; its
  ``DeviceSegmentedReduce`` (what ``cupy.sum`` runs for several outputs) gives
  each output one block, which is the very parallelism missing, so several
  outputs stay on our kernel split across blocks (``reduce_cuda.split_layout``).

Float16 never takes the library path: CuPy's CUB sum is ``DeviceReduce::Sum``
on ``__half`` (``cupy/cuda/cupy_cub.cu``), which accumulates in float16 (only
CuPy's own reduction kernel widens float16 to float32), and our kernels
accumulate in float32 on every path, as the CPU does. Groups past CUB's
``int`` item count, or with the accelerator off, stay on our kernel too
(``cupy.sum`` would then run CuPy's own reduction, one block per output).

Capture: ``cupy.sum`` on CUB asks CUB for its workspace size (host only),
allocates the workspace and the result from the current memory pool (the
captured graph's own pool during capture) and launches on the current
stream; it neither synchronises nor reads device memory back, so the node
stays capture-safe. This was read in CuPy's source, not yet seen in a
captured graph on a device (tests/cuda/test_cuda_reduce_routing.py captures one).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

KERNEL = "kernel"
LIBRARY = "library"
#: Items CUB takes in one call (its ``num_items`` is an ``int``).
CUB_MAX_ITEMS = 2**31 - 1


@dataclass(frozen=True)
class ReduceRoute:
    """The path a reduction takes and why, as the kernel's note shows it."""

    path: str  # KERNEL or LIBRARY
    reason: str

    def describe(self) -> str:
        where = "our block-reduction kernel" if self.path == KERNEL else "CuPy's CUB reduction"
        return f"{where}: {self.reason}"


def route_reduction(
    outputs: int,
    group: int,
    dtype: np.dtype,
    sms: int,
    *,
    library: bool,
    threads: int,
    grain: int,
    fill_per_sm: int,
) -> ReduceRoute:
    """Where ``outputs`` sums (or means) of ``group`` elements each should run.

    ``library``: whether ``cupy.sum`` would run CUB here (CuPy's CUB accelerator is on);
    ``threads``: threads of one of our reduction blocks; ``grain``: the fewest elements a
    thread should combine before a group is worth more than one block; ``fill_per_sm``:
    blocks per SM that fill the device.
    """
    fill = fill_per_sm * sms
    if outputs == 0:
        return ReduceRoute(KERNEL, "no outputs")
    if outputs >= fill:
        return ReduceRoute(KERNEL, f"{outputs} outputs fill the device ({fill} blocks)")
    if group <= threads * grain:
        return ReduceRoute(
            KERNEL, f"groups of {group} fit one block at {grain} elements per thread"
        )
    few = f"{outputs} outputs over groups of {group}"
    if np.dtype(dtype) != np.float32:
        return ReduceRoute(
            KERNEL, f"{few}, split across blocks: CUB would sum {np.dtype(dtype).name} in it"
        )
    if outputs > 1:
        return ReduceRoute(
            KERNEL, f"{few}, split across blocks: CUB's segmented reduce is one block per output"
        )
    if group > CUB_MAX_ITEMS:
        return ReduceRoute(KERNEL, f"{few}, split across blocks: past CUB's {CUB_MAX_ITEMS} items")
    if not library:
        return ReduceRoute(KERNEL, f"{few}, split across blocks: CuPy's CUB accelerator is off")
    return ReduceRoute(LIBRARY, f"{few}: CUB's device-wide reduction spreads it over the device")


def cub_enabled() -> bool:
    """Whether ``cupy.sum`` runs CUB here (CuPy imported and its CUB accelerator on)."""
    try:
        from cupy._core import _accelerator
    except ImportError:
        return False
    try:
        return _accelerator.ACCELERATOR_CUB in _accelerator.get_routine_accelerators()
    except AttributeError:  # a CuPy without the accelerator registry: do not guess
        return False
