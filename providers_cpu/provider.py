"""The CPU provider instance: NumPy arrays in host memory.

Option ``intra_op_num_threads`` (the session's ``SessionOptions.intra_op_num_threads``
when set, as onnxruntime names it): the BLAS threads NumPy uses during this provider's
runs, and the most its kernels split their own work over. 0 or absent: one count chosen
for the session from its plan (thread_policy.py: one thread unless its largest product
gains from a split, then every core), fixed for all its runs and reported by
``session_notes`` (``InferenceSession.placement()``, ``onnxep explain``).

Option ``allow_spinning`` (``"1"`` or ``"0"``; the session's config entry
``session.intra_op.allow_spinning``, as onnxruntime names it): whether the threads that run
a compiled kernel's split poll for the next split for ``handoff.SPIN_US`` before they sleep
(the default, as onnxruntime's pool spins), or sleep as soon as their part is done, leaving
the cores to the rest of the process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument
from onnxep.providers import Claim, Decline, NodeInfo, Provider

from .handoff import SPIN_US
from .openblas_core import openblas_notes
from .ops.conv_direct import session_notes as conv_direct_notes
from .ops.conv_gemm import session_notes as conv_gemm_notes
from .ops.weight_gemm import session_notes as weight_gemm_notes
from .thread_policy import choose, product_macs, split_bound
from .threads import blas_threads, cpu_count, process_blas_threads


class CPUProvider(Provider):
    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        super().__init__("cpu", options, device="cpu", xp=np)
        n = self.options.get("intra_op_num_threads", 0)
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
            raise InvalidArgument(
                f"intra_op_num_threads must be a whole number >= 0 (0: one count chosen per "
                f"session from its plan), got {n!r}"
            )
        self.threads = int(n)  # as asked; 0: chosen from the claimed nodes
        spin = self.options.get("allow_spinning", "1")
        if str(spin) not in ("0", "1"):
            raise InvalidArgument(
                f"allow_spinning (session.intra_op.allow_spinning) must be '0' or '1' (1: "
                f"split threads poll for the next split a while before they sleep), got "
                f"{spin!r}"
            )
        self.spin = str(spin) == "1"
        # the product claimed nearest its split bound: multiply-adds, node, bound
        self._largest = (0, "", 1)
        self._chosen = 0  # the count, settled on first use (after every claim)
        self._holder: blas_threads | None = None  # the run context, made once
        if self.threads or not self.spin:
            self.run_context = self._hold

    def claim(self, node: NodeInfo) -> Claim | Decline:
        got = super().claim(node)
        # A node whose inputs are all constants is folded or computed once at creation,
        # not in a run.
        if not self.threads and isinstance(got, Claim) and not _all_constant(node):
            macs = product_macs(node)
            bound = split_bound(node)
            if macs and macs * self._largest[2] > self._largest[0] * bound:
                self._largest = (macs, node.name or node.op_type, bound)
                # Claims come before the executor asks for run contexts: a session with
                # no product holds nothing per run, as no provider's context costs.
                self.run_context = self._hold
        return got

    @property
    def blas_thread_count(self) -> int:
        """The BLAS threads of this provider's runs. Claims are made while the session is
        created, so the count is settled before its first run and the same for all."""
        if not self._chosen:
            if self.threads:
                self._chosen = self.threads
            elif self._largest[0]:
                self._chosen = choose(self._largest[0], cpu_count(), self._largest[2])
            else:
                # No product: nothing to hold (a context costs some microseconds a run,
                # as much as a one-node model's run); reported as the process's count.
                self._chosen = process_blas_threads()
        return self._chosen

    def _hold(self) -> contextlib.AbstractContextManager[Any] | None:
        # One holder for every run: it keeps no state of its own (the count in force is
        # the module's), and the property and a new object were a microsecond per run.
        holder = self._holder
        if holder is None:
            holder = self._holder = blas_threads(self.blas_thread_count, self.spin)
        return holder

    def session_notes(self) -> list[str]:
        n = self.blas_thread_count
        return [
            *self._thread_notes(),
            *openblas_notes(),
            *conv_gemm_notes(n),
            *conv_direct_notes(),
            *weight_gemm_notes(n),
        ]

    def _thread_notes(self) -> list[str]:
        spin = (
            f"split threads poll {SPIN_US:g} us for the next split before they sleep"
            if self.spin
            else "split threads sleep after each split (session.intra_op.allow_spinning=0)"
        )
        return [*self._count_notes(), spin]

    def _count_notes(self) -> list[str]:
        n = self.blas_thread_count
        if self.threads:
            return [f"BLAS threads: {n} (intra_op_num_threads={n})"]
        macs, node, bound = self._largest
        if not macs:
            return [
                f"BLAS threads: {n}, the process's count (intra_op_num_threads=0 and no "
                f"matrix product in the session)"
            ]
        largest = f"node {node!r}, {macs / 1e6:.3g}M multiply-adds"
        side = "at least" if macs >= bound else "under"
        return [
            f"BLAS threads: {n} of {cpu_count()} cores, chosen for the session "
            f"(intra_op_num_threads=0): largest product {largest}, "
            f"{side} the {bound / 1e6:.3g}M a split "
            f"needs; set intra_op_num_threads to choose"
        ]

    def to_host(self, value: Any) -> Any:
        return value

    def from_host(self, value: Any) -> Any:
        return value


def _all_constant(node: NodeInfo) -> bool:
    return all(v is None or v.const is not None for v in node.inputs)
