"""Greedy decoding's one-launch argmax (``providers_cuda/ops/argmax_cuda.py``) on the emulator.

Each row's id must be NumPy's argmax (ties to the lowest index, the first NaN winning),
written where the caller points, also when several blocks share a row and the last one
to finish merges their partials (the emulated device has 4 SMs, so long rows split), with
every ticket back at zero for the next launch (a CUDA graph replays on them).
"""

from __future__ import annotations

import cuda_emulator as emu
import numpy as np
import pytest

from onnxep.providers_cuda.ops import argmax_cuda as A

#: Host version of the kernel's 64-bit shuffle: two 32-bit halves through the emulator's.
HOST_SHFL_I64 = r"""
static inline long long shfl_xor_i(long long v, int lane_mask) {
  unsigned long long u = (unsigned long long)v;
  unsigned lo = (unsigned)u, hi = (unsigned)(u >> 32);
  float flo, fhi;
  memcpy(&flo, &lo, 4); memcpy(&fhi, &hi, 4);
  flo = emu::shfl_xor(flo, lane_mask); fhi = emu::shfl_xor(fhi, lane_mask);
  memcpy(&lo, &flo, 4); memcpy(&hi, &fhi, 4);
  return (long long)(((unsigned long long)hi << 32) | lo);
}
"""


@pytest.fixture
def argmax(monkeypatch):
    why = emu.why_unavailable()
    if why:
        pytest.skip(why)
    emu.install(monkeypatch)
    monkeypatch.setattr(A, "SHFL_I64", HOST_SHFL_I64)
    emu.ALL_NAMES.setdefault(A.source(), A.ARGMAX_NAMES)
    return A.ArgMaxRows(np)


@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=["f16", "f32"])
@pytest.mark.parametrize(("rows", "n"), [(1, 1000), (1, 40000), (3, 20000), (2, 5)])
def test_each_row_gets_numpys_argmax(argmax, rows, n, dtype):
    rng = np.random.default_rng(rows * n)
    x = rng.standard_normal((rows, n)).astype(dtype)
    out = np.full(rows, -1, np.int64)
    argmax(x, out)
    np.testing.assert_array_equal(out, np.argmax(x, axis=-1))
    bpr = A.blocks_per_row(n, rows, emu.EMULATED_SMS)
    for _, _, done in argmax.scratch.values():
        assert not done.any()  # every ticket back at zero
    if n == 40000:
        assert bpr > 1


def test_ties_go_to_the_lowest_index_and_nan_wins(argmax):
    n = 40000  # several blocks a row: the merge must keep the order too
    x = np.zeros((4, n), np.float32)
    x[0, [7, 30000, 39999]] = 5.0
    x[1, [100, 35000]] = np.nan
    x[1, 200] = np.inf
    x[2, :] = -np.inf
    x[3, [33000, 2]] = 1.0
    out = np.zeros((4, 1), np.int64)  # the next step's [batch, 1] ids
    argmax(x, out)
    np.testing.assert_array_equal(out[:, 0], np.argmax(x, axis=-1))
    assert out[:, 0].tolist() == [7, 100, 0, 2]


def test_the_last_position_of_a_batch_of_logits(argmax):
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((2, 1, 3000)).astype(np.float16)
    out = np.zeros((2, 1), np.int64)
    argmax(logits[:, -1], out)  # one position: the view is dense
    np.testing.assert_array_equal(out[:, 0], np.argmax(logits[:, -1], axis=-1))


def test_driver_launch_signature_matches_the_kernels(argmax, monkeypatch):
    """``launch.Launcher`` packs 8-byte arguments by a signature string: the kernel's own."""
    from onnxep.providers_cuda import elementwise, launch

    made = []

    class Recorder:
        def __init__(self, fn, signature, dependent=False):
            made.append((fn.name, fn.signature, signature))
            assert dependent, "argmax_rows waits (pdl_wait) and is launched as a dependent kernel"

    monkeypatch.setattr(launch, "Launcher", Recorder)
    monkeypatch.setattr(elementwise, "stream_ptr_fn", lambda: lambda: 0)
    argmax.driver()
    assert len(made) == len(A.ARGMAX_NAMES)
    for name, real, packed in made:
        assert packed == real, name


def test_argmax_waits_before_it_reads_the_logits():
    """Launched with programmatic dependent launch, argmax_rows may start while the logits'
    GEMV runs: the wait comes before its first statement that reads or writes memory."""
    body = A.ARGMAX_BODY.split("argmax_rows(")[1]
    body = body[body.index(") {") :]
    wait = body.index("pdl_wait();")
    for use in ("row[j]", "pv[", "done + r", "out[r * out_stride]"):
        assert body.index(use) > wait, use
