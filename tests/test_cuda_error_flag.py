"""The host side of the CUDA index kernels' error flag, and their host-only planning.

The record layout, its decoding and the message a user reads; the flag's
check-and-clear cycle as the CUDA provider drives it (on a host record, as
the kernel emulator uses); the thread-local flag builders report to; and the
addressing GatherElements/ScatterElements collapse to, checked against
NumPy's own indexing. None of this needs a GPU.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from onnxep.errors import RunError
from onnxep.providers_cuda import error_flag
from onnxep.providers_cuda.error_flag import ErrorFlag, Fault, decode, encode
from onnxep.providers_cuda.ops import index_cuda as ix

# ----------------------------------------------------------------------------- the record


@pytest.mark.parametrize(
    "fault",
    [
        Fault(node=0, axis=0, value=5, position=1, dim=5, count=4),
        Fault(node=3, axis=2, value=-(2**40) - 7, position=2**33 + 1, dim=2**35, count=2**36),
        Fault(node=1, axis=1, value=-1, position=0, dim=0, count=1),
    ],
)
def test_a_record_round_trips(fault):
    words = encode(fault)
    assert words.dtype == np.int32 and words.shape == (error_flag.RECORD_WORDS,)
    assert decode(words) == fault


def test_the_layout_is_the_kernels():
    """Word by word what ``ix_report`` writes: state, node, axis, then 64-bit pairs low first."""
    w = encode(Fault(2, 1, -(2**33) - 3, 7, 4, 9)).view(np.uint32)
    assert list(w[:3]) == [1, 2, 1]
    value = (-(2**33) - 3) & (2**64 - 1)
    assert (int(w[4]), int(w[5])) == (value & 0xFFFFFFFF, value >> 32)
    assert [int(x) for x in w[6:12]] == [7, 0, 4, 0, 9, 0]


def test_a_clear_record_is_no_fault_and_a_wrong_one_is_refused():
    assert decode(np.zeros(error_flag.RECORD_WORDS, np.int32)) is None
    with pytest.raises(ValueError, match="16 int32 words"):
        decode(np.zeros(8, np.int32))


# ----------------------------------------------------------------------------- the message


def _message(fault, shape=None, label="Gather node 'embed'"):
    return error_flag.fault_message(fault, label, shape)


def test_the_message_names_node_value_position_axis_and_range():
    msg = _message(Fault(0, 0, 151936, 4, 151936, 6), (2, 3))
    assert msg.startswith(
        "Gather node 'embed': indices value 151936 at indices[1, 1] is out of range for axis 0 "
        "of size 151936: valid values are -151936 to 151935."
    )
    assert "session stays usable" in msg


def test_a_scalar_index_has_no_position():
    assert "value -7 at indices is out of range" in _message(Fault(0, 1, -7, 0, 6, 1), ())


def test_without_a_matching_shape_the_position_is_flat():
    """A node run with another indices shape since the check cannot unravel the position."""
    for shape in (None, (5,)):
        msg = _message(Fault(0, 0, 9, 4, 3, 6), shape)
        assert "at entry 4 of the 6 indices (flattened, row-major)" in msg


def test_an_empty_axis_has_no_valid_value():
    assert "axis 2 of size 0: no value is valid there" in _message(Fault(0, 2, 0, 0, 0, 1))


# ----------------------------------------------------------------------------- the flag's cycle


class _Recorded:
    """A host record whose reads and clears are counted, as the provider's stream queues them."""

    def __init__(self):
        self.words = np.zeros(error_flag.RECORD_WORDS, np.int32)
        self.mirror = np.zeros_like(self.words)
        self.reads = self.clears = 0
        self.flag = ErrorFlag(self.words, self.mirror, self._read, self._clear)

    def _read(self):
        self.reads += 1
        self.mirror[:] = self.words

    def _clear(self):
        self.clears += 1
        self.words[:] = 0


def test_a_flag_without_index_kernels_never_reads():
    r = _Recorded()
    r.words[:] = encode(Fault(0, 0, 1, 0, 1, 1))  # even a set record stays unread
    r.flag.before_sync()
    r.flag.after_sync()
    assert r.reads == 0


def test_a_set_record_raises_once_and_is_cleared():
    r = _Recorded()
    node = r.flag.register("GatherND", "pick")
    r.flag.shapes[node] = (2, 2)
    r.flag.before_sync()
    r.flag.after_sync()  # clear: nothing to say
    assert (r.reads, r.clears, r.flag.raised) == (1, 0, 0)
    r.words[:] = encode(Fault(node, 1, -6, 3, 5, 4))
    r.flag.before_sync()
    want = r"^GatherND node 'pick': indices value -6 at indices\[1, 1\]"
    with pytest.raises(RunError, match=want):
        r.flag.after_sync()
    assert (r.clears, r.flag.raised) == (1, 1)
    assert not r.words.any() and not r.mirror.any()
    r.flag.before_sync()
    r.flag.after_sync()  # the session goes on
    assert r.flag.raised == 1


def test_a_record_from_an_unknown_node_still_raises():
    r = _Recorded()
    r.flag.register("Gather", "g")
    r.words[:] = encode(Fault(9, 0, 4, 0, 4, 1))
    r.flag.before_sync()
    with pytest.raises(RunError, match="a node \\(id 9, not one of this session's\\)"):
        r.flag.after_sync()


def test_the_host_flag_is_its_own_mirror():
    flag = ErrorFlag.on_host()
    flag.register("Gather", "g")
    flag.words[:] = encode(Fault(0, 0, 3, 0, 3, 1))
    flag.before_sync()
    with pytest.raises(RunError, match="indices value 3"):
        flag.after_sync()
    assert not flag.words.any()


def test_builders_see_the_flag_of_their_own_thread():
    a, b = ErrorFlag.on_host(), ErrorFlag.on_host()
    seen = {}

    def other():
        seen["other"] = error_flag.current()

    assert error_flag.current() is None
    with error_flag.building(a):
        with error_flag.building(b):
            assert error_flag.current() is b
            t = threading.Thread(target=other)
            t.start()
            t.join()
        assert error_flag.current() is a
    assert error_flag.current() is None and seen["other"] is None


# ----------------------------------------------------------------------------- planning


def _offsets(ishape, dshape, axis, idx):
    """Where each index element reads in data, by the collapsed addressing (as the kernel)."""
    dims, strides, ax = ix.collapse_elements(ishape, dshape, axis)
    assert len(dims) == ix.MAX_DIMS
    out = []
    for o, i in enumerate(idx.reshape(-1)):
        off, rem = 0, o
        for d in range(ix.MAX_DIMS - 1, -1, -1):
            rem, c = divmod(rem, dims[d])
            off += (i if d == ax else c) * strides[d]
        out.append(off)
    return np.array(out)


@pytest.mark.parametrize("seed", range(40))
def test_collapsed_element_addressing_matches_numpy(seed):
    rng = np.random.default_rng(seed)
    rank = int(rng.integers(1, 6))
    dshape = tuple(int(v) for v in rng.integers(1, 5, rank))
    axis = int(rng.integers(0, rank))
    ishape = tuple(
        int(rng.integers(1, 6)) if d == axis else int(rng.integers(1, m + 1))
        for d, m in enumerate(dshape)
    )
    idx = rng.integers(0, dshape[axis], ishape)
    coords = list(np.indices(ishape))
    coords[axis] = idx
    want = np.ravel_multi_index(tuple(coords), dshape).reshape(-1)
    np.testing.assert_array_equal(_offsets(ishape, dshape, axis, idx), want)


def test_full_dims_merge_and_unit_dims_drop():
    dims, strides, ax = ix.collapse_elements((2, 3, 4, 5), (2, 3, 6, 5), 2)
    assert (dims, strides, ax) == ((1, 1, 1, 6, 4, 5), (0, 0, 0, 30, 5, 1), 4)
    dims, _, ax = ix.collapse_elements((1, 7, 1), (4, 9, 3), 1)
    assert dims[-1] == 7 and ax == ix.MAX_DIMS - 1


def test_too_many_dims_come_back_unpadded():
    """Index dims shorter than data's never merge: seven of them are more than the kernels take."""
    dims, _, _ = ix.collapse_elements((2,) * 7, (3,) * 7, 0)
    assert len(dims) == 7 > ix.MAX_DIMS


@pytest.mark.parametrize(
    ("row_bytes", "width"), [(1792, 16), (28, 4), (24, 8), (6, 2), (5, 1), (0, 16)]
)
def test_copy_units_divide_the_row(row_bytes, width):
    assert ix.unit_width(row_bytes) == width


def test_grids_cover_small_work_and_cap_large_work():
    assert ix.grid_for(1, 132) == 1
    assert ix.grid_for(ix.BLOCK * 10 + 1, 132) == 11
    assert ix.grid_for(10**9, 132) == 132 * ix.BLOCKS_PER_SM
