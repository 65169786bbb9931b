"""The CUDA index kernels run on the CPU through the kernel emulator (no GPU needed).

The cases are the GPU tests' own (tests/cuda/test_cuda_index.py): each
kernel built directly, launches counted, outputs compared with the CPU
provider's generic kernel, bad indices reported through the error flag. The
CUDA C is compiled with g++ by tests/cuda_emulator.py, with
:data:`HOST_PRIMITIVES` standing in for ``index_cuda.PRIMITIVES`` (fibers
of one block never interleave between two statements, so plain
read-modify-writes stand in for atomics). A one-node session on a provider
that runs these kernels on NumPy arrays, with the CUDA provider's flag hooks
at its copies to the host, checks the error's path through the executor.
"""

from __future__ import annotations

import cuda_emulator as emu
import numpy as np
import pytest
from emulated_provider import registered

import onnxep
from onnxep.errors import RunError
from onnxep.providers_cuda import error_flag
from onnxep.providers_cuda.ops import index_cuda
from onnxep.providers_cuda.ops import op_scatter_elements as scatter_elements
from onnxep.providers_cuda.ops import op_scatter_nd as scatter_nd

gpu_index = emu.gpu_test_module("test_cuda_index")

#: Host stand-ins for ``index_cuda.PRIMITIVES`` (same names, same results).
HOST_PRIMITIVES = r"""
static inline bool ix_claim(int* flag) { if (*flag) return false; *flag = 1; return true; }
static inline float ix_h2f(__half x) { return __half2float(x); }
static inline __half ix_f2h(float x) { return __float2half_rn(x); }
static inline unsigned short ix_bits(__half x) { return x.bits; }
static inline unsigned int ix_bits(float x) { unsigned int b; memcpy(&b, &x, 4); return b; }
static inline unsigned long long ix_bits(double x) {
  unsigned long long b; memcpy(&b, &x, 8); return b;
}
static inline unsigned int ix_bits(int x) { return (unsigned int)x; }
static inline unsigned long long ix_bits(long long x) { return (unsigned long long)x; }
static inline void ix_unbits(unsigned short b, __half* x) { x->bits = b; }
static inline void ix_unbits(unsigned int b, float* x) { memcpy(x, &b, 4); }
static inline void ix_unbits(unsigned long long b, double* x) { memcpy(x, &b, 8); }
static inline void ix_unbits(unsigned int b, int* x) { *x = (int)b; }
static inline void ix_unbits(unsigned long long b, long long* x) { *x = (long long)b; }
template <typename B> static inline B ix_cas_host(B* p, B e, B d) {
  const B old = *p; if (old == e) *p = d; return old;
}
static inline unsigned short ix_cas(unsigned short* p, unsigned short e, unsigned short d) {
  return ix_cas_host(p, e, d);
}
static inline unsigned int ix_cas(unsigned int* p, unsigned int e, unsigned int d) {
  return ix_cas_host(p, e, d);
}
static inline unsigned long long ix_cas(unsigned long long* p, unsigned long long e,
                                        unsigned long long d) {
  return ix_cas_host(p, e, d);
}
static inline void ix_atomic_add(float* p, float v) { *p = *p + v; }
static inline void ix_atomic_add(double* p, double v) { *p = *p + v; }
static inline void ix_atomic_add(int* p, int v) { *p = (int)((unsigned)*p + (unsigned)v); }
static inline void ix_atomic_add(long long* p, long long v) {
  *p = (long long)((unsigned long long)*p + (unsigned long long)v);
}
static inline void ix_atomic_max(int* p, int v) { if (v > *p) *p = v; }
static inline void ix_atomic_max(long long* p, long long v) { if (v > *p) *p = v; }
static inline void ix_atomic_min(int* p, int v) { if (v < *p) *p = v; }
static inline void ix_atomic_min(long long* p, long long v) { if (v < *p) *p = v; }
"""


class EmulatedDevice:
    """``index_cuda.Device`` on the host: NumPy arrays, kernels run by the emulator."""

    sms = emu.EMULATED_SMS

    def kernels(self, body, names, signature):
        compiled = emu.compile_kernels(HOST_PRIMITIVES + body, names)
        return {n: self._launcher(compiled[n], signature) for n in names}

    @staticmethod
    def _launcher(k, signature):
        def launch(grid, block, args, stream):
            conv = tuple(np.int64(a) if c == "q" else a for c, a in zip(signature, args))
            k((grid,), (block,), conv)

        return launch

    @staticmethod
    def address(a):
        return a

    @staticmethod
    def aligned(a, width):
        return a.ctypes.data % width == 0

    @staticmethod
    def empty(shape, dtype):
        out = np.empty(shape, dtype)
        out.reshape(-1).view(np.uint8).fill(0xA5)  # an element never written shows
        return out

    @staticmethod
    def copy(dst, src):
        np.copyto(dst, src)

    @staticmethod
    def contiguous(a):
        return a.flags.c_contiguous

    ascontiguous = staticmethod(np.ascontiguousarray)

    @staticmethod
    def stream():
        return 0


@pytest.fixture(scope="module")
def available():
    why = emu.why_unavailable()
    if why:
        pytest.skip(why)
    # one build per kernel body, whatever reduction a node asks for first
    emu.ALL_NAMES.setdefault(HOST_PRIMITIVES + scatter_elements.BODY, scatter_elements.ALL_NAMES)
    emu.ALL_NAMES.setdefault(HOST_PRIMITIVES + scatter_nd.BODY, scatter_nd.ALL_NAMES)


@pytest.fixture
def device(available, monkeypatch):
    counting = gpu_index.CountingDevice(EmulatedDevice())
    monkeypatch.setattr(index_cuda, "device_for", lambda xp: counting if xp is np else None)
    return counting


@pytest.fixture
def emulated(device):
    """(np, upload, download, flag, sync, launch counts), as the GPU tests' ``gpu`` fixture."""
    flag = error_flag.ErrorFlag.on_host()

    def sync():
        flag.before_sync()
        flag.after_sync()

    return np, np.array, lambda a: a, flag, sync, device.counts


@pytest.mark.parametrize("case", gpu_index.GOOD, ids=lambda c: c.id)
def test_builder_matches_cpu(case, emulated):
    gpu_index.check_good(case, *emulated)


@pytest.mark.parametrize("case", gpu_index.BAD, ids=lambda c: c.id)
def test_builder_reports_bad_index(case, emulated):
    gpu_index.check_bad(case, *emulated)


def _plain_scatters():
    cases = [*gpu_index.GOOD, *map(gpu_index.clamped, gpu_index.BAD)]
    plain = [c for c in cases if c.attrs.get("reduction", "none") == "none"]
    return [c for c in plain if c.op.startswith("Scatter")]


@pytest.mark.parametrize("case", _plain_scatters(), ids=lambda c: c.id)
def test_plain_scatter_cases_write_distinct_places(case):
    """Among duplicates a plain scatter keeps any one (the GPU's choice is a race), so the
    shared cases must not have any: counted by scattering ones with reduction add."""
    data, idx, upd = case.inputs
    op = "ScatterND" if case.op == "ScatterND" else "ScatterElements"
    attrs = {**case.attrs, "reduction": "add"}
    zeros, ones = np.zeros(data.shape, np.float32), np.ones(upd.shape, np.float32)
    counting = gpu_index.IndexCase(case.id, op, (zeros, idx, ones), attrs, 18)
    (hits,) = gpu_index.expected(counting)
    assert hits.max() <= 1


@pytest.mark.parametrize("case", gpu_index.BAD_GATHERS, ids=lambda c: c.id)
def test_gathers_write_zeros_for_a_bad_index(case, emulated):
    gpu_index.check_zero_rows(case, *emulated)


def test_rows_copy_in_the_widest_aligned_units(emulated, device):
    xp, _, download, flag, sync, _ = emulated

    def upload(a):  # on a 64-byte boundary, so views keep the offsets the test picks
        buf = np.empty(a.nbytes + 64, np.uint8)
        start = -buf.ctypes.data % 64
        out = buf[start : start + a.nbytes].view(a.dtype).reshape(a.shape)
        out[...] = a
        return out

    gpu_index.check_row_units(xp, upload, download, flag, sync, device, lambda a: a.ctypes.data)


def test_without_a_flag_the_generic_kernel_runs(device):
    """Built outside a provider (no flag to report to), the node keeps its bounds check."""
    case = gpu_index.BAD[0]
    fn = gpu_index.builders(case.op)[0](gpu_index.node_for(case), np)
    with pytest.raises(IndexError, match="indices value 5 at indices\\[0, 1\\]"):
        fn(*case.inputs)
    assert not device.counts


REDUCIBLE = (np.float32, np.float16, np.float64, np.int32, np.int64)
DTYPES = (*REDUCIBLE, np.uint8, bool)


def _random_case(rng, i):
    """A random in-range case of any of the ops: rank 1-4, dims 1-5, any dtype, either index
    type, negative indices, duplicates only where a reduction makes them well defined."""
    op = ("Gather", "GatherElements", "GatherND", "ScatterElements", "ScatterND")[i % 5]
    dt = DTYPES[rng.integers(len(DTYPES))]
    it = (np.int32, np.int64)[rng.integers(2)]
    r = int(rng.integers(1, 5))
    ds = tuple(int(v) for v in rng.integers(1, 6, r))
    red = ("none", "add", "mul", "max", "min")[rng.integers(5)] if dt in REDUCIBLE else "none"
    exact = dt == np.float16 and red in ("add", "mul")  # sums and products exact in any order
    data = gpu_index.quarter_data(ds, dt, i) if exact else gpu_index.random_data(ds, dt, i)

    def idx(dim, shape):
        return rng.integers(-dim, dim, shape).astype(it)

    def upd(shape):
        u = (
            gpu_index.quarter_data(shape, dt, i + 1) / 2
            if exact
            else gpu_index.random_data(shape, dt, i + 1)
        )
        return (u % 3 if red == "mul" and np.dtype(dt).kind == "i" else u).astype(dt)

    a = int(rng.integers(-r, r))
    if op == "Gather":
        ishape = tuple(int(v) for v in rng.integers(1, 4, int(rng.integers(0, 3))))
        return gpu_index.gather_case(f"r{i}", data, idx(ds[a], ishape), axis=a)
    if op == "GatherND":
        b = int(rng.integers(0, r))
        k = int(rng.integers(1, r - b + 1))
        lead = ds[:b] + tuple(int(v) for v in rng.integers(1, 4, int(rng.integers(0, 3))))
        tuples = np.stack([idx(ds[b + c], lead) for c in range(k)], -1)
        return gpu_index.nd_case(f"r{i}", data, tuples, b=b)
    if op == "GatherElements":
        ishape = tuple(
            int(rng.integers(1, 6)) if d == a % r else int(rng.integers(1, m + 1))
            for d, m in enumerate(ds)
        )
        return gpu_index.elements_case(f"r{i}", data, idx(ds[a], ishape), axis=a)
    if op == "ScatterElements":
        ishape = tuple(int(rng.integers(1, m + 1)) for m in ds)
        if red == "none":  # distinct targets along the axis: a prefix of a permutation
            order = np.argsort(rng.random(ishape[: a % r] + (ds[a],) + ishape[a % r + 1 :]), a)
            ix = np.take(order, np.arange(ishape[a]), axis=a)
            ix = np.where(rng.random(ix.shape) < 0.5, ix - ds[a], ix).astype(it)
        else:
            ix = idx(ds[a], ishape)
        return gpu_index.scatter_case(f"r{i}", data, ix, upd(ishape), axis=a, reduction=red)
    k = int(rng.integers(1, r + 1))
    n = int(rng.integers(1, 5))
    if red == "none":  # distinct tuples
        flat = rng.permutation(int(np.prod(ds[:k])))[:n]
        n = len(flat)
        ix = np.stack(np.unravel_index(flat, ds[:k]), -1)
        ix = np.where(rng.random(ix.shape) < 0.5, ix - np.array(ds[:k]), ix).astype(it)
    else:
        ix = np.stack([idx(ds[c], n) for c in range(k)], -1)
    return gpu_index.scatter_nd_case(f"r{i}", data, ix, upd((n, *ds[k:])), reduction=red)


@pytest.mark.parametrize("seed", range(4))
def test_random_cases_match_cpu(seed, emulated):
    """Four hundred random shapes, axes, dtypes and reductions, each through its kernel."""
    rng = np.random.default_rng(seed)
    for i in range(100):
        case = _random_case(rng, 100 * seed + i)
        emulated[5].clear()
        gpu_index.check_good(case, *emulated)


def test_a_second_bad_index_does_not_overwrite_the_first(emulated):
    """The first launch to meet a bad index owns the record until the next check."""
    xp, upload, download, flag, sync, _ = emulated
    first, second = gpu_index.BAD[0], gpu_index.BAD[1]
    fns = []
    for case in (first, second):
        with error_flag.building(flag):
            fns.append(gpu_index.builders(case.op)[0](gpu_index.node_for(case), xp))
    fns[0](*first.inputs)
    fns[1](*second.inputs)
    with pytest.raises(RunError, match=f"'{first.id}-node': indices value 5 "):
        sync()
    sync()


# ----------------------------------------------------------------------------- in a session

NAME = "ixemu"


@pytest.fixture(scope="module")
def provider(available):
    mods = ("op_gather", "op_gather_elements", "op_gather_nd", "op_scatter_elements",
            "op_scatter_nd")  # fmt: skip
    with registered(NAME, mods) as name:
        yield name


def _sessions(case, provider):
    m = gpu_index.model_for(case)
    opts = onnxep.SessionOptions(disable_fallback=True)
    cpu = onnxep.InferenceSession(m, providers=["cpu"])
    return onnxep.InferenceSession(m, opts, [provider]), cpu


@pytest.mark.parametrize("case", gpu_index.BAD, ids=lambda c: c.id)
def test_session_raises_on_the_output_copy_and_stays_usable(case, provider, device):
    emulated, cpu = _sessions(case, provider)
    gpu_index.check_session_raises(case, emulated, cpu)
    assert device.counts[case.kernel] == 3
    assert emulated.providers[0].error_flag.raised == 1


def test_session_parity_with_a_constant_table(provider, device):
    case = next(c for c in gpu_index.GOOD if c.id == "gather-f16-embedding")
    m = gpu_index.model_for(case, data_as_constant=True)
    opts = onnxep.SessionOptions(disable_fallback=True)
    sess = onnxep.InferenceSession(m, opts, [provider])
    f = gpu_index.feeds_for(case, data_as_constant=True)
    (want,) = onnxep.InferenceSession(m, providers=["cpu"]).run(None, f)
    (got,) = sess.run(None, f)
    np.testing.assert_array_equal(got, want)
    assert device.counts["ix_gather"] == 1
