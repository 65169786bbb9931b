"""The CPU provider's numba glue (providers_cpu/jit.py): ``jit.lazy``'s compile-once getter
and the cache names of loops that compile jit.py's helpers into another file."""

from __future__ import annotations

import numpy as np
import pytest

from onnxep.providers_cpu import jit

pytestmark = pytest.mark.skipif(not jit.ENABLED, reason="numba not installed or off")


def _inner(x):
    return x * 3


def _outer(x):
    return _inner(x) + 1


def test_lazy_compiles_once_with_its_helpers_first():
    get = jit.lazy(_outer, helpers=("_inner",), error_model="numpy")
    f = get()
    assert get() is f
    assert hasattr(globals()["_inner"], "py_func")  # the helper, compiled where _outer looks
    assert f(np.float32(2)) == 7
    assert f.targetoptions["error_model"] == "numpy" and f.targetoptions["nogil"]


def test_lazy_says_when_the_loops_are_off(monkeypatch):
    monkeypatch.setattr(jit, "ENABLED", False)
    with pytest.raises(RuntimeError, match="_outer: compiled loops are off"):
        jit.lazy(_outer)()


def test_loops_with_jit_helpers_carry_its_digest():
    """A loop that compiles jit.py's helper in another file names its disk-cache entry
    after jit.py's contents, so an edit there is never answered from a stale entry."""
    from onnxep.providers_cpu import jit_nbits
    from onnxep.providers_cpu.ops import softmax_loops

    digest = jit.source_digest()
    assert len(digest) == 16
    for f in (
        jit_nbits.loop("quantize_a"),
        jit_nbits.loop("matvec", False, 1),
        softmax_loops.softmax_flat,
    ):
        assert f.py_func.__qualname__.endswith(digest)


def test_the_direct_conv_carries_the_digest_of_what_it_compiles_in():
    """conv_direct's ``_direct`` compiles jit.py's ``_conv_act`` and packed_gemm.py's vector
    code: its cache name carries a digest of both files."""
    from onnxep.providers_cpu.ops import conv_direct

    digest = conv_direct.source_digest()
    assert len(digest) == 16 and digest != jit.source_digest()
    assert conv_direct.jit_direct().py_func.__qualname__ == f"_direct_{digest}"
