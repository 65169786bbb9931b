"""A chain of float32 elementwise steps in one compiled pass (numba): onnxep::ElementwiseChain.

Imported only once ``jit.ENABLED`` has said numba is there and wanted. One loop runs
any chain the fusion (``providers_cpu/elementwise_chains.py``) builds, so numba compiles
once (cached on disk), not once per model: the chain is data (a step code and, for a
binary step, which packed operand it reads), interpreted one block of output elements
at a time. Per block each step is one plain loop over the block, which LLVM vectorises,
and the block stays in L1 between steps: a chain of k steps reads its operands and writes
its output once, where NumPy makes k passes and k calls (about 0.35 us each on a few
elements: the executor's per-node floor, bench/overhead.py).

**Values**: each step rounds to float32 as the NumPy ufunc does (IEEE add, subtract,
multiply, divide and square root, no contraction into FMA: numba leaves fastmath off), so
the output is the unfused nodes' bit for bit. Relu is ``op_relu``'s (NaN through, -0 to
+0).

**Operands**: every operand, the chain's first value too, broadcasts into the output as one
run of dims (elementwise steps commute with broadcasting, so broadcasting the first value
up front gives the unfused nodes' values), so its element for output
element i is ``(i // inner) % count`` of its flat data (a scalar: count 1; a full tensor:
inner 1, count = size; a bias per channel: inner = the spatial size). The constants are
packed into one buffer once, the others (at most ``FED``) passed as they are, and the plan
is one table: numba's dispatch costs about 0.1 us an argument.
"""

from __future__ import annotations

import numpy as np

from .. import jit

if not jit.ENABLED:  # reading it imports numba, or says why not
    raise ImportError("providers_cpu.ops.chain_loops needs numba (see providers_cpu/jit.py)")
nb = jit.nb

# Step codes. A binary step combines the chain's value v with an operand s.
ADD, SUB, RSUB, MUL, DIV, RDIV, RELU, NEG, ABS, SQRT, RECIP, LOAD = range(12)
FIRST_UNARY = RELU
#: Rows of the plan table ``meta``: per step (the first is LOAD, the chain's first value)
#: its code, where its operand is (0: the packed
#: constants, 1-4: fed operand f0-f3), its offset in the constants, inner and count.
CODE, SOURCE, OFFSET, INNER, COUNT = range(5)
#: Operands that are not constants: passed as they are (packing them would copy them on
#: every run), so a chain reads at most this many.
FED = 4

#: Output elements per block: the block, its operand and the output fit in L1.
BLOCK = 512


#: Runs at least this long of one repeated operand value are applied as a scalar, run by
#: run; shorter ones are spread into a block buffer first.
SCALAR_RUN = 16


@nb.njit(inline="always", nogil=True)
def _with_scalar(c, v, y):
    """v = v (op c) y, y one value."""
    m = v.size
    if c == LOAD:
        for i in range(m):
            v[i] = y
    elif c == ADD:
        for i in range(m):
            v[i] = v[i] + y
    elif c == SUB:
        for i in range(m):
            v[i] = v[i] - y
    elif c == RSUB:
        for i in range(m):
            v[i] = y - v[i]
    elif c == MUL:
        for i in range(m):
            v[i] = v[i] * y
    elif c == DIV:
        for i in range(m):
            v[i] = v[i] / y
    else:
        for i in range(m):
            v[i] = y / v[i]


@nb.njit(inline="always", nogil=True)
def _with_array(c, v, y):
    """v = v (op c) y, elementwise over v's size."""
    m = v.size
    if c == LOAD:
        for i in range(m):
            v[i] = y[i]
    elif c == ADD:
        for i in range(m):
            v[i] = v[i] + y[i]
    elif c == SUB:
        for i in range(m):
            v[i] = v[i] - y[i]
    elif c == RSUB:
        for i in range(m):
            v[i] = y[i] - v[i]
    elif c == MUL:
        for i in range(m):
            v[i] = v[i] * y[i]
    elif c == DIV:
        for i in range(m):
            v[i] = v[i] / y[i]
    else:
        for i in range(m):
            v[i] = y[i] / v[i]


@nb.njit(inline="always", nogil=True)
def _unary(c, v):
    m = v.size
    one = np.float32(1.0)
    zero = np.float32(0.0)
    if c == RELU:
        for i in range(m):
            x = v[i]
            v[i] = x if x > zero or x != x else zero
    elif c == NEG:
        for i in range(m):
            v[i] = -v[i]
    elif c == ABS:
        for i in range(m):
            v[i] = abs(v[i])
    elif c == SQRT:
        for i in range(m):
            v[i] = np.sqrt(v[i])
    else:
        for i in range(m):
            v[i] = one / v[i]


@nb.njit(inline="always", nogil=True)
def _step(c, v, a, o, start, n, inner, count, buf):
    """One binary (or LOAD) step on the block v = output elements start .. start + v.size."""
    m = v.size
    if count == 1:
        _with_scalar(c, v, a[o])
    elif inner == 1 and count == n:
        _with_array(c, v, a[o + start : o + start + m])  # a full operand, read in place
    elif inner >= SCALAR_RUN:
        # a value per run of inner elements (a bias per channel): each run as a scalar step
        q = start // inner
        r = start - q * inner
        k = q % count
        i = 0
        while i < m:
            seg = min(inner - r, m - i)
            _with_scalar(c, v[i : i + seg], a[o + k])
            i += seg
            r = 0
            k += 1
            if k == count:
                k = 0
    else:
        _spread(a, o, start, m, inner, count, buf)
        _with_array(c, v, buf[:m])


@nb.njit(inline="always", nogil=True)
def _spread(a, o, start, m, inner, count, buf):
    """An operand's elements for output elements start .. start + m, into buf[:m]: a
    scalar's, or a broadcast one's (element ``(i // inner) % count`` of its data at o),
    written run by run (a value repeated ``inner`` times, or ``count`` values in a row)."""
    # slice assignments, not element loops: numba makes them vector copies and fills
    if count == 1:
        buf[:m] = a[o]
        return
    q = start // inner
    c = q % count
    i = 0
    if inner == 1:  # the operand's data again and again: copies of its runs
        while i < m:
            seg = min(count - c, m - i)
            # an element loop over two views from 0: numba's slice copy checks for overlap
            # and may go through a temporary
            dst = buf[i : i + seg]
            src = a[o + c : o + c + seg]
            for t in range(seg):
                dst[t] = src[t]
            i += seg
            c = 0
        return
    r = start - q * inner
    while i < m:  # each value repeated over its run of inner elements
        seg = min(inner - r, m - i)
        buf[i : i + seg] = a[o + c]
        i += seg
        r = 0
        c += 1
        if c == count:
            c = 0


@nb.njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def run(out, meta, consts, f0, f1, f2, f3):
    """out (flat, float32) = the chain ``meta`` describes, from its LOAD step on."""
    n = out.size
    steps = meta.shape[1]
    buf = np.empty(BLOCK, np.float32)
    for start in range(0, n, BLOCK):
        v = out[start : start + min(BLOCK, n - start)]
        for k in range(steps):
            c = meta[CODE, k]
            if FIRST_UNARY <= c < LOAD:
                _unary(c, v)
                continue
            src = meta[SOURCE, k]
            a = (
                consts
                if src == 0
                else f0
                if src == 1
                else f1
                if src == 2
                else f2
                if src == 3
                else f3
            )
            _step(c, v, a, meta[OFFSET, k], start, n, meta[INNER, k], meta[COUNT, k], buf)
