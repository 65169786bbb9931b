"""A tree ensemble's whole run compiled (numba): walk, weight sums, base values, post transform.

Imported only once ``jit.ENABLED`` has said numba is there and wanted (``tree_eval``
builds the tables at session creation and calls :func:`run`). On a few rows the
NumPy aggregation and post transform were about ten calls of 1-4 us on 4 x 3 arrays,
twice the walk itself (skl2onnx-treecl: 13 us a run against onnxruntime's 6); here
one call does it all, its arguments packed into four arrays (numba's dispatch costs
about 0.13 us an argument).

**Tables** (built by :func:`pack`): ``itab`` (intp) is a header (``H_*``) then the
roots, NaN slots, each leaf's first weight and weight count, and the weights' targets;
``nt`` each node's feature, children and threshold (:func:`node_table`); ``ftab``
(float64) the weights then the base values. Bounds are the builder's proof, not a
check per read: ``Forest`` refuses children, roots and weight targets outside their
tables, leaves without weights and cycles (``tree_depths`` levels take every walk to a
leaf), and the caller refuses an input narrower than the largest feature index + 1,
so every read below is inside its table. A leaf keeps feature 0 and threshold +inf,
so a walk that has reached it reads column 0 (present: the input has at least
``max_feature + 1 >= 1`` columns when there is an interior node) and stays.

**Values**: the traversal is ``tree_eval``'s (the same comparisons in the same type,
so the same leaves); sums in float64, trees in order, a leaf's weights in attribute
order (as ``Forest.scores``'s bincount adds them; the dense and per-target NumPy paths
sum in NumPy's pairwise order, so a sum may differ from them in its last float64 bit,
which the float32 result does not show but at a rounding tie); the post transforms
are ``ml_common``'s formulas in float64 (libm's ``exp``/``log``/``sqrt`` here, NumPy's
SIMD ones there: within an ulp of float64).
"""

from __future__ import annotations

import math

import numpy as np

from .. import jit
from .ml_common import LOGISTIC, PROBIT, SOFTMAX, SOFTMAX_ZERO
from .tree_eval import AVERAGE, CLASSIFY, MAX, MIN, REGRESS, SUM, SUMS

if not jit.ENABLED:  # reading it imports numba, or says why not
    raise ImportError("providers_cpu.ops.tree_loops needs numba (see providers_cpu/jit.py)")
nb = jit.nb

# Rows whose walks advance together through one tree (their reads overlap; 128 walks'
# nodes and rows stay in the L1 and L2 caches).
_ROW_BLOCK = 128

# Header of ``itab``.
(
    H_TREES,
    H_INNER,
    H_NAN_FIX,
    H_TARGETS,
    H_AGG,
    H_FIRST_ONLY,
    H_FINISH,
    H_POST,
    H_BASE,
    O_ROOTS,
    O_TDEPTH,
    O_NAN,
    O_WSTART,
    O_WCOUNT,
    O_WTARGET,
    O_FBASE,
    HEADER,
) = range(17)


def pack(forest, finish: int, post: int, base: np.ndarray, agg: int = SUM):
    """The tables :func:`run` reads, for ``forest`` (a ``tree_eval.Forest``).

    ``finish`` is what the run does after the sums: CLASSIFY (more than two classes: base
    values on the first classes, argmax over the scored ones, post transform) or REGRESS
    (base values when one per target, unscored targets 0, post transform; one target: its
    first weights only, the base value when there is one, PROBIT the only transform) or SUMS
    (nothing: the float64 sums, and in ``top`` a bit per scored target; at most 62 targets).
    """
    n_t = forest.n_targets
    first_only = finish == REGRESS and n_t == 1
    if finish == SUMS and n_t > 62:
        raise ValueError(f"the raw sums' scored-target bits hold 62 targets, not {n_t}")
    if finish == CLASSIFY:
        n_base = min(len(base), n_t)
    elif finish == SUMS:
        n_base = 0
    elif first_only:
        n_base = 1 if len(base) == 1 else 0
    else:
        n_base = n_t if len(base) == n_t else 0
    parts = [
        forest.roots,
        tree_depths(forest),
        forest.nan_slot.astype(np.intp),
        forest.w_start,
        forest.w_count,
        forest.w_target,
    ]
    offsets, at = [], HEADER
    for p in parts:
        offsets.append(at)
        at += len(p)
    header = [
        forest.n_trees,
        forest.n_inner,
        int(forest.nan_fix),
        n_t,
        agg,
        int(first_only),
        finish,
        post,
        n_base,
        *offsets,
        len(forest.w_value),
    ]
    itab = np.concatenate([np.asarray(header, np.intp), *[np.asarray(p, np.intp) for p in parts]])
    ftab = np.concatenate([forest.w_value, np.asarray(base[:n_base], np.float64)])
    return itab, node_table(forest), ftab


def tree_depths(forest) -> np.ndarray:
    """Levels of each tree (0 for a leaf alone): the steps its walks take to a leaf."""
    n_inner, n_trees = forest.n_inner, forest.n_trees
    depth = np.zeros(n_trees, np.intp)
    node, tree = forest.roots, np.arange(n_trees, dtype=np.intp)
    for level in range(1, forest.depth + 1):  # Forest refused cycles: depth bounds every walk
        inner = node < n_inner
        node, tree = node[inner], tree[inner]
        if not node.size:
            break
        depth[tree] = level
        kids = np.concatenate([forest.kids[2 * node], forest.kids[2 * node + 1]])
        both = np.unique(np.stack([kids, np.concatenate([tree, tree])]), axis=1)
        node, tree = both[0], both[1]
    return depth


def node_table(forest) -> np.ndarray:
    """Each node's feature, its two children and its threshold's bits side by side (four
    integers of the threshold's width: 16 bytes a node for float32 comparisons), so a step
    of a walk reads one line, not one from each of three tables."""
    thr = np.ascontiguousarray(forest.thr)
    ints = np.int32 if thr.dtype == np.float32 else np.int64
    if len(forest.feat) >= 2**31 - 1:
        ints = np.int64
        thr = thr.astype(np.float64)
    nt = np.empty((len(thr), 4), ints)
    nt[:, 0] = forest.feat
    nt[:, 1] = forest.kids[0::2]
    nt[:, 2] = forest.kids[1::2]
    nt[:, 3] = thr.view(ints)
    return nt.reshape(-1)


@nb.njit(inline="always", nogil=True, error_model="numpy")
def _logistic(v):
    e = 1.0 / (1.0 + math.exp(-abs(v)))
    return 1.0 - e if v < 0 else e


@nb.njit(inline="always", nogil=True, error_model="numpy")
def _probit(v):
    y = 2.0 * v - 1.0
    t = (1.0 - y) * (1.0 + y)
    ln = math.log(t) if t > 0 else (-math.inf if t == 0 else math.nan)
    a = 2.0 / (math.pi * 0.147) + 0.5 * ln
    d = a * a - ln / 0.147
    r = math.sqrt(d) - a if d >= 0 else math.nan
    r = math.sqrt(r) if r >= 0 else math.nan
    return 1.41421356 * (-r if y < 0 else r)


@nb.njit(inline="always", nogil=True, error_model="numpy")
def _post_row(s, r, post, out):
    """``ml_common.apply_post`` on row ``r`` of ``s``, into ``out[r]`` (float32); the row of
    ``s`` may be overwritten."""
    n = s.shape[1]
    if post == SOFTMAX or post == SOFTMAX_ZERO:
        m = s[r, 0]
        for c in range(1, n):
            v = s[r, c]
            if v > m or v != v:  # np.maximum.reduce: NaN wins
                m = v
                if v != v:
                    break
        # Each exponential once, kept in the row of s (the caller's scratch from here on):
        # the same values and sums as taking them twice, at half the libm calls.
        total = 0.0
        if post == SOFTMAX:
            for c in range(n):
                e = math.exp(s[r, c] - m)
                s[r, c] = e
                total += e
            for c in range(n):
                out[r, c] = s[r, c] / total
        else:
            em = math.exp(-m)
            for c in range(n):
                v = s[r, c]
                if abs(v) > 1e-7:
                    e = math.exp(v - m)
                    total += e
                else:
                    e = v * em
                s[r, c] = e
            for c in range(n):
                out[r, c] = s[r, c] / total
    elif post == LOGISTIC:
        for c in range(n):
            out[r, c] = _logistic(s[r, c])
    elif post == PROBIT:
        for c in range(n):
            out[r, c] = _probit(s[r, c])
    else:
        for c in range(n):
            out[r, c] = s[r, c]


@nb.njit(cache=True, nogil=True, boundscheck=False, error_model="numpy")
def run(x, itab, nt, nt_thr, ftab, out, top):
    """One run of the ensemble on the rows of ``x`` (2-D, C order, the comparison type).
    ``nt`` is :func:`node_table`'s table and ``nt_thr`` the same memory viewed as the
    comparison type (its thresholds at ``4 * node + 3``).

    ``out`` (rows x targets, float32) gets the transformed scores; ``top`` (rows) the
    classifier's label index (left alone for the regressor).
    """
    n_rows, n_cols = x.shape
    n_trees = itab[H_TREES]
    n_inner = itab[H_INNER]
    nan_fix = itab[H_NAN_FIX] != 0
    n_t = itab[H_TARGETS]
    agg = itab[H_AGG]
    first_only = itab[H_FIRST_ONLY] != 0
    finish = itab[H_FINISH]
    post = itab[H_POST]
    n_base = itab[H_BASE]
    roots = itab[itab[O_ROOTS] : itab[O_TDEPTH]]
    t_depth = itab[itab[O_TDEPTH] : itab[O_NAN]]
    nan_slot = itab[itab[O_NAN] : itab[O_WSTART]]
    w_start = itab[itab[O_WSTART] : itab[O_WCOUNT]]
    w_count = itab[itab[O_WCOUNT] : itab[O_WTARGET]]
    w_target = itab[itab[O_WTARGET] :]
    w_value = ftab[: itab[O_FBASE]]
    base = ftab[itab[O_FBASE] :]

    width = 1 if first_only else n_t
    s = np.zeros((n_rows, width))
    has = np.zeros((n_rows, width), np.bool_)
    if agg == MIN:
        s[:] = np.inf
    elif agg == MAX:
        s[:] = -np.inf
    # Tree by tree over blocks of rows: one tree's nodes stay in the L1 cache while the
    # block's walks, independent of each other, advance a level at a time so their reads
    # overlap; each tree only as deep as it goes. Sums still add each row's trees in order.
    walk = np.empty(min(n_rows, _ROW_BLOCK), np.intp)
    for r0 in range(0, n_rows, _ROW_BLOCK):
        n = min(n_rows, r0 + _ROW_BLOCK) - r0
        for t in range(n_trees):
            root = roots[t]
            for i in range(n):
                walk[i] = root
            for _ in range(t_depth[t]):
                for i in range(n):
                    nd = walk[i]
                    o = 4 * nd
                    v = x[r0 + i, nt[o]]
                    c = v > nt_thr[o + 3]
                    if nan_fix and v != v:
                        c = nan_slot[nd] != 0
                    walk[i] = nt[o + (2 if c else 1)]
            for i in range(n):
                r = r0 + i
                leaf = walk[i] - n_inner
                k0 = w_start[leaf]
                k1 = k0 + (1 if first_only else w_count[leaf])
                for k in range(k0, k1):
                    j = 0 if first_only else w_target[k]
                    w = w_value[k]
                    if agg == MIN:
                        cur = s[r, j]
                        if cur == cur and (w != w or w < cur):
                            s[r, j] = w
                    elif agg == MAX:
                        cur = s[r, j]
                        if cur == cur and (w != w or w > cur):
                            s[r, j] = w
                    else:
                        s[r, j] += w
                    has[r, j] = True

    if finish == SUMS:
        for r in range(n_rows):
            bits = 0
            for j in range(width):
                out[r, j] = s[r, j]
                if has[r, j]:
                    bits |= 1 << j
            top[r] = bits
        return
    for r in range(n_rows):
        if agg == AVERAGE and n_trees:
            for j in range(width):
                s[r, j] = s[r, j] / n_trees
        if finish == CLASSIFY:
            for j in range(n_base):
                s[r, j] += base[j]
                has[r, j] = True
            # np.argmax over the scored classes (others -inf): the first maximum, NaN first.
            best = 0
            bv = s[r, 0] if has[r, 0] else -np.inf
            if bv == bv:
                for j in range(1, width):
                    v = s[r, j] if has[r, j] else -np.inf
                    if v != v:
                        best = j
                        break
                    if v > bv:
                        best = j
                        bv = v
            top[r] = best
        elif first_only:
            if agg == MIN or agg == MAX:
                if not n_trees:
                    s[r, 0] = 0.0
            if n_base:
                s[r, 0] += base[0]
            if post == PROBIT:
                out[r, 0] = _probit(s[r, 0])
            else:
                out[r, 0] = s[r, 0]
            continue
        else:
            for j in range(width):
                if agg == MIN or agg == MAX:
                    if not has[r, j]:
                        s[r, j] = 0.0
                if j < n_base:
                    s[r, j] += base[j]
                if not has[r, j]:
                    s[r, j] = 0.0
        _post_row(s, r, post, out)
