"""The tree-ensemble evaluator shared by TreeEnsemble (ml opset 5) and the older
TreeEnsembleClassifier / TreeEnsembleRegressor (ml opsets 1 and 3).

Every tree of every row advances one level per step, as flat arrays over rows x
trees: the Python loop runs once per level of the deepest tree, never per row or
node. Each node is rewritten at build time so that one comparison, ``x > t``,
picks between its two children, stored side by side (``kids[2 * node + c]``):

- ``x <= t`` keeps t, true child first; ``x < t`` becomes ``x <= prev(t)`` (the
  next float below t in the comparison type, exact for every x of that type);
  ``x > t`` and ``x >= t`` (as ``x > prev(t)``) put the false child first.
- A leaf points to itself in both slots with t = +inf, so a row that reached a
  leaf stays there while deeper trees finish.
- NaN (``x > t`` is false, slot 0) is fixed only where a node sends it elsewhere
  (``nodes_missing_value_tracks_true``, GTE/GT, NEQ), and only when the input has one.
- BRANCH_EQ / BRANCH_NEQ / BRANCH_MEMBER nodes add a second comparison on a
  slower path taken only by ensembles that have them (LightGBM's categorical splits).

Comparisons run in the input's precision as onnxruntime's do (float32 thresholds
for float, int and float16 inputs, float64 for double); scores add up in float64.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxep.errors import NotSupported

from .. import jit
from .nn_cpu import parallel_rows

LEQ, LT, GTE, GT, EQ, NEQ, MEMBER, LEAF = range(8)
MODES = {
    "BRANCH_LEQ": LEQ,
    "BRANCH_LT": LT,
    "BRANCH_GTE": GTE,
    "BRANCH_GT": GT,
    "BRANCH_EQ": EQ,
    "BRANCH_NEQ": NEQ,
    "BRANCH_MEMBER": MEMBER,
    "LEAF": LEAF,
}
AVERAGE, SUM, MIN, MAX = range(4)
AGGREGATES = {"AVERAGE": AVERAGE, "SUM": SUM, "MIN": MIN, "MAX": MAX}
# Which kernel's finish a compiled whole run does (tree_loops); SUMS: none, the raw sums and
# which targets were scored, for the two-class rules the classifier applies itself.
CLASSIFY, REGRESS, SUMS = range(3)

_DENSE_LIMIT = 1 << 22  # leaves x targets held as a dense table up to this many entries
_DENSE_TARGETS = 16  # beyond this many targets, weights add up through one bincount
_BLOCK = 1 << 15  # rows x trees per block of the traversal
# Up to this many walks (rows x trees) the compiled traversal of ``leaves`` runs (jit.py,
# numba): it was 2.3x faster on 4 rows of 100 depth-10 trees, even at 20 rows, and 10-20%
# slower from 40 rows on, where NumPy's level-wide gathers are the better loop.
_COMPILED_WALKS = 2048
# A table read of a walk, in the multiply-adds ``parallel_rows`` weighs work in (a dependent
# gather of 3-5 ns against a multiply-add's fraction of one): where a run's rows are split.
_READ_COST = 50


@dataclass
class Nodes:
    """An ensemble in one flat form before it is compiled.

    Interior nodes are numbered 0..n_inner-1 and leaves n_inner..; children and
    roots use that numbering. ``weights`` are (leaf number - n_inner, target, weight)
    triples; ``members[i]`` the set of a BRANCH_MEMBER node i.
    """

    op: str
    feature: np.ndarray
    threshold: np.ndarray
    mode: np.ndarray
    true_child: np.ndarray
    false_child: np.ndarray
    nan_true: np.ndarray
    roots: np.ndarray
    n_leaves: int
    leaf: np.ndarray
    target: np.ndarray
    weight: np.ndarray
    n_targets: int
    members: dict[int, list[float]] | None = None


class Forest:
    """A compiled ensemble: ``leaves(x)`` for every row and tree, ``scores`` to aggregate."""

    def __init__(self, nodes: Nodes, dtype: Any) -> None:
        op = self.op = nodes.op
        self.dtype = dt = np.dtype(dtype)
        n_in = self.n_inner = len(nodes.feature)
        n_leaf = nodes.n_leaves
        total = n_in + n_leaf
        self.n_trees = len(nodes.roots)
        self.n_targets = nodes.n_targets
        for name, ids in (("true", nodes.true_child), ("false", nodes.false_child)):
            if ids.size and (ids.min() < 0 or ids.max() >= total):
                raise NotSupported(f"{op}: a {name} child names a node that does not exist")
        if nodes.roots.size and (nodes.roots.min() < 0 or nodes.roots.max() >= total):
            raise NotSupported(f"{op}: a tree root names a node that does not exist")
        if nodes.feature.size and nodes.feature.min() < 0:
            raise NotSupported(f"{op}: a node reads a negative feature index")
        self.max_feature = int(nodes.feature.max()) if n_in else -1

        mode = nodes.mode
        t = np.asarray(nodes.threshold, dtype=dt)
        below = np.nextafter(t, dt.type(-np.inf))
        thr = np.full(total, np.inf, dtype=dt)
        thr[:n_in] = np.where((mode == LT) | (mode == GTE), below, t)
        # Slot 0 is the child ``x > thr`` being false selects (``x != t`` for EQ kinds).
        true_first = (mode == LEQ) | (mode == LT) | (mode == EQ) | (mode == MEMBER)
        kids = np.empty(2 * total, np.intp)
        kids[0 : 2 * n_in : 2] = np.where(true_first, nodes.true_child, nodes.false_child)
        kids[1 : 2 * n_in : 2] = np.where(true_first, nodes.false_child, nodes.true_child)
        kids[2 * n_in :: 2] = kids[2 * n_in + 1 :: 2] = np.arange(n_in, total)
        self.kids = kids
        self.thr = thr
        self.feat = np.zeros(total, np.intp)
        self.feat[:n_in] = nodes.feature
        self.roots = nodes.roots.astype(np.intp)
        self.depth = _depth(op, kids, self.roots, n_in)

        # The slower comparison path: EQ/NEQ (x != t) and MEMBER (x not in the set).
        self.eq = np.zeros(total, bool)
        self.eq[:n_in] = (mode == EQ) | (mode == NEQ)
        self.member = np.zeros(total, bool)
        self.member[:n_in] = mode == MEMBER
        self.t_exact = np.full(total, np.inf, dtype=dt)
        self.t_exact[:n_in] = t
        self.general = bool(self.eq.any() or self.member.any())
        self.member_table = _member_table(op, nodes.members, self.member, total, dt)

        # Where NaN goes: the true branch with missing tracks or for NEQ, else the false one.
        nan_to_true = nodes.nan_true.astype(bool) | (mode == NEQ)
        nan_slot = np.where(nan_to_true == true_first, 0, 1).astype(bool)
        natural = self.eq[:n_in] | self.member[:n_in]  # x != t / not-in-set is true for NaN
        self.nan_slot = np.zeros(total, bool)
        self.nan_slot[:n_in] = nan_slot
        self.nan_fix = bool((nan_slot != natural).any())
        self._weights(nodes, n_leaf)
        self.always = self._always_scored(n_leaf)
        self.always_all = bool(self.always.all())
        self._rows: dict[tuple[int, int], np.ndarray] = {}
        #: The kernel's compiled whole run (:meth:`fused`), when it made one.
        self.run_fused: Any = None

    def _weights(self, nodes: Nodes, n_leaf: int) -> None:
        op, n_t = self.op, self.n_targets
        leaf, target = nodes.leaf.astype(np.intp), nodes.target.astype(np.intp)
        weight = np.asarray(nodes.weight, dtype=np.float64)
        if leaf.size and (leaf.min() < 0 or leaf.max() >= n_leaf):
            raise NotSupported(f"{op}: a weight is given for a node that is not a leaf")
        if target.size and (target.min() < 0 or target.max() >= n_t):
            raise NotSupported(
                f"{op}: a leaf weight is for target {int(target.max())}, beyond the "
                f"{n_t} targets or classes the node declares"
            )
        order = np.argsort(leaf, kind="stable")
        leaf, target, weight = leaf[order], target[order], weight[order]
        counts = np.bincount(leaf, minlength=n_leaf)
        self.w_count = counts
        self.w_start = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.intp)
        self.w_leaf, self.w_target, self.w_value = leaf, target, weight
        self.single = bool(n_leaf and (counts == 1).all())
        self.dense = None
        if not self.single and n_t <= _DENSE_TARGETS and n_leaf * n_t <= _DENSE_LIMIT:
            dense = np.zeros((n_t, n_leaf))
            np.add.at(dense, (target, leaf), weight)
            has = np.zeros((n_t, n_leaf), bool)
            has[target, leaf] = True
            self.dense, self.dense_has = dense, has

    def _always_scored(self, n_leaf: int) -> np.ndarray:
        """Per target: whether some tree weights it in every leaf, so every row scores it.

        Boosted multiclass ensembles give each tree one class; then no per-row count of
        the classes reached is needed.
        """
        n_in, n_t = self.n_inner, self.n_targets
        tree_of = np.full(n_in + n_leaf, -1, np.intp)
        tree_of[self.roots] = np.arange(self.n_trees)
        frontier = self.roots
        for _ in range(self.depth):
            frontier = frontier[frontier < n_in]
            for slot in (0, 1):
                kid = self.kids[2 * frontier + slot]
                tree_of[kid] = tree_of[frontier]
            frontier = np.unique(self.kids[np.concatenate([2 * frontier, 2 * frontier + 1])])
        leaf_tree = tree_of[n_in:]
        leaves_per_tree = np.bincount(leaf_tree[leaf_tree >= 0], minlength=self.n_trees)
        # Leaves of each (tree, target) that carry a weight for it (each leaf counted once).
        pairs = np.unique(np.stack([self.w_leaf, self.w_target]), axis=1)
        trees = leaf_tree[pairs[0]]
        ok = trees >= 0
        hits = np.zeros((self.n_trees, n_t), np.int64)
        np.add.at(hits, (trees[ok], pairs[1][ok]), 1)
        full = (hits == leaves_per_tree[:, None]) & (leaves_per_tree[:, None] > 0)
        return full.any(axis=0)

    def fused(self, finish: int, post: int, base: np.ndarray, agg: int = SUM) -> Any:
        """The whole run compiled (``tree_loops``: walk, sums, base values, post transform),
        as ``run(x) -> (scores float32, label index)`` for a 2-D ``x`` of any number of rows
        (split over the run's threads); None without numba or with EQ/MEMBER nodes."""
        if self.general or not jit.ENABLED:
            return None
        from . import tree_loops

        first_only = finish == REGRESS and self.n_targets == 1
        if first_only and self.w_count.size and self.w_count.min() < 1:
            return None  # a leaf without a first weight: the NumPy path says what it does
        itab, nt, ftab = tree_loops.pack(self, finish, post, base, agg)
        nt_thr = nt.view(self.thr.dtype if nt.itemsize == self.thr.itemsize else np.float64)
        loop, dtype, n_trees = tree_loops.run, self.dtype, self.n_trees
        width = 1 if first_only else self.n_targets
        steps = max(1, n_trees * self.depth)  # table reads a row takes

        def run(x: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
            n_rows, n_cols = x.shape
            if not jit.ENABLED:
                return None
            if n_cols <= self.max_feature:
                self._narrow(n_cols)
            xc = np.ascontiguousarray(x, dtype)
            out = np.empty((n_rows, width), np.float64 if finish == SUMS else np.float32)
            top = np.empty(n_rows, np.intp)
            # Each row is computed whole by one call, so the split never changes a result.
            parallel_rows(
                n_rows,
                n_rows * steps * _READ_COST,
                lambda r0, r1: loop(xc[r0:r1], itab, nt, nt_thr, ftab, out[r0:r1], top[r0:r1]),
            )
            return out, top

        return run

    def _narrow(self, n_cols: int) -> None:
        raise ValueError(
            f"{self.op}: a node reads feature {self.max_feature}, but the input has "
            f"{n_cols} features per row"
        )

    # -- traversal ------------------------------------------------------------------
    def _row_base(self, n_rows: int, n_cols: int) -> np.ndarray:
        """``row * n_cols`` for each row and tree (cached: read it, never write to it)."""
        key = (n_rows, n_cols)
        base = self._rows.get(key)
        if base is None:
            base = np.repeat(np.arange(n_rows, dtype=np.intp) * n_cols, self.n_trees)
            if len(self._rows) > 8:
                self._rows.clear()
            self._rows[key] = base
        return base

    def leaves(self, x: np.ndarray) -> np.ndarray:
        """The leaf each tree ends in for each row: ``(rows, trees)``, numbered from 0."""
        n_rows, n_cols = x.shape
        if n_cols <= self.max_feature:
            self._narrow(n_cols)
        xf = np.ascontiguousarray(x, dtype=self.dtype)
        if not self.general and n_rows * self.n_trees <= _COMPILED_WALKS and jit.ENABLED:
            # The same steps compiled: on a few rows each NumPy call below costs
            # microseconds for a hundred elements.
            out = np.empty(n_rows * self.n_trees, np.intp)
            jit.loop("tree_leaves")(
                xf.reshape(-1), n_cols, self.roots, self.feat, self.thr, self.kids,
                self.depth, self.nan_slot, self.nan_fix, out,
            )  # fmt: skip
            out -= self.n_inner
            return out.reshape(n_rows, self.n_trees)
        nd = np.empty((n_rows, self.n_trees), np.intp)
        nd[:] = self.roots  # np.tile's own cost is several of these
        nd = nd.reshape(-1)
        if self.depth:
            nan = self.nan_fix and xf.dtype.kind == "f" and bool(np.isnan(xf).any())
            # Rows go in blocks whose working arrays stay in cache.
            step = max(1, _BLOCK // max(self.n_trees, 1))
            for r0 in range(0, n_rows, step):
                r1 = min(n_rows, r0 + step)
                block = nd[r0 * self.n_trees : r1 * self.n_trees]
                self._descend(block, xf[r0:r1].reshape(-1), r1 - r0, n_cols, nan)
        return (nd - self.n_inner).reshape(n_rows, self.n_trees)

    def _descend(self, nd: np.ndarray, xf: np.ndarray, n_rows: int, n_cols: int, nan: bool):
        """Move ``nd`` (rows x trees, in place) down to the leaves, one level per step."""
        base = self._row_base(n_rows, n_cols)
        feat, thr, kids = self.feat, self.thr, self.kids
        f = np.empty_like(nd)
        v = np.empty(nd.shape, self.dtype)
        t = np.empty(nd.shape, self.dtype)
        c = np.empty(nd.shape, bool)
        # mode="clip" takes skip the bounds check (the tables were checked when built,
        # and the features against the input width): every index is in range. The
        # array methods, not np.take, as the wrapper costs more than a small take.
        for _ in range(self.depth):
            feat.take(nd, None, f, "clip")
            f += base
            xf.take(f, None, v, "clip")
            thr.take(nd, None, t, "clip")
            np.greater(v, t, out=c)
            if self.general:
                c = self._general(nd, v, c)
            if nan:
                c = np.where(np.isnan(v), self.nan_slot.take(nd), c)
            nd <<= 1
            nd += c
            kids.take(nd, None, nd, "clip")

    def _general(self, nd: np.ndarray, v: np.ndarray, c: np.ndarray) -> np.ndarray:
        eq = self.eq.take(nd)
        if eq.any():
            c = np.where(eq, v != self.t_exact.take(nd), c)
        mem = self.member.take(nd)
        if mem.any():
            sets = self.member_table[nd[mem]]
            c[mem] = ~(sets == v[mem, None]).any(axis=1)
        return c

    # -- aggregation ----------------------------------------------------------------
    def scores(
        self, leaves: np.ndarray, agg: int = SUM, first_only: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per row and target: the aggregated weights and whether any leaf gave one.

        ``first_only`` counts only the first weight of each leaf, for target 0
        (onnxruntime's one-target path, which reads a leaf's first weight only).
        """
        n_rows = leaves.shape[0]
        n_t = 1 if first_only else self.n_targets
        li = leaves.reshape(-1)
        if first_only:
            val = self.w_value[self.w_start].take(li).reshape(n_rows, self.n_trees)
            return self._reduce_columns(val[:, :, None], agg)
        if agg in (SUM, AVERAGE):
            if self.single and n_t == 1:
                s = self.w_value.take(li).reshape(n_rows, self.n_trees).sum(axis=1, keepdims=True)
                has = np.ones((n_rows, 1), bool) if self.n_trees else np.zeros((n_rows, 1), bool)
            elif self.single and li.size <= _COMPILED_WALKS and jit.ENABLED:
                # The bincount below, compiled: on a few rows its six NumPy calls cost more.
                s = np.zeros((n_rows, n_t))
                has = np.zeros((n_rows, n_t), bool)
                jit.loop("tree_leaf_sums")(li, self.n_trees, self.w_target, self.w_value, s, has)
            elif self.single:
                # One weight per leaf: its index is the leaf's own number.
                idx = self._row_base(n_rows, n_t) + self.w_target.take(li)
                s = np.bincount(idx, weights=self.w_value.take(li), minlength=n_rows * n_t)
                s = s.reshape(n_rows, n_t)
                has = self._has(idx, n_rows)
            elif self.dense is not None:
                s = np.empty((n_rows, n_t))
                has = np.empty((n_rows, n_t), bool)
                for t in range(n_t):
                    s[:, t] = self.dense[t].take(li).reshape(n_rows, self.n_trees).sum(axis=1)
                    has[:, t] = self.always[t] or (
                        self.dense_has[t].take(li).reshape(n_rows, self.n_trees).any(axis=1)
                    )
            else:
                idx, val = self._entries(li, n_rows)
                s = np.bincount(idx, weights=val, minlength=n_rows * n_t).reshape(n_rows, n_t)
                has = self._has(idx, n_rows)
            if agg == AVERAGE and self.n_trees:
                s = s / self.n_trees
            return s, has
        idx, val = self._entries(li, n_rows)
        fill = np.inf if agg == MIN else -np.inf
        s = np.full(n_rows * n_t, fill)
        (np.minimum if agg == MIN else np.maximum).at(s, idx, val)
        has = np.bincount(idx, minlength=n_rows * n_t) > 0
        s = np.where(has, s, 0.0)
        return s.reshape(n_rows, n_t), has.reshape(n_rows, n_t)

    def _has(self, idx: np.ndarray, n_rows: int) -> np.ndarray:
        if self.always_all:
            return np.ones((n_rows, self.n_targets), bool)
        return (
            np.bincount(idx, minlength=n_rows * self.n_targets).reshape(n_rows, self.n_targets) > 0
        )

    def _reduce_columns(self, val: np.ndarray, agg: int) -> tuple[np.ndarray, np.ndarray]:
        n_rows = val.shape[0]
        has = np.full((n_rows, 1), self.n_trees > 0)
        if not self.n_trees:
            return np.zeros((n_rows, 1)), has
        if agg == MIN:
            return val.min(axis=1), has
        if agg == MAX:
            return val.max(axis=1), has
        s = val.sum(axis=1)
        return (s / self.n_trees if agg == AVERAGE else s), has

    def _entries(self, li: np.ndarray, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
        """Every (row * targets + target, weight) the reached leaves hold."""
        cnt = self.w_count.take(li)
        owner = np.repeat(np.arange(li.size, dtype=np.intp), cnt)
        first = np.repeat(self.w_start.take(li) - (np.cumsum(cnt) - cnt), cnt)
        pos = np.arange(owner.size, dtype=np.intp) + first
        row = owner // max(self.n_trees, 1)
        return row * self.n_targets + self.w_target[pos], self.w_value[pos]


def _depth(op: str, kids: np.ndarray, roots: np.ndarray, n_inner: int) -> int:
    """Levels of the deepest tree; a cycle (no leaf reachable) is refused."""
    frontier = np.unique(roots)
    depth = 0
    while True:
        frontier = frontier[frontier < n_inner]
        if not frontier.size:
            return depth
        depth += 1
        if depth > n_inner:
            raise NotSupported(f"{op}: a tree has a cycle (a path that never reaches a leaf)")
        frontier = np.unique(np.concatenate([kids[2 * frontier], kids[2 * frontier + 1]]))


def _member_table(
    op: str, members: dict[int, list[float]] | None, is_member: np.ndarray, total: int, dt: Any
) -> np.ndarray | None:
    if not is_member.any():
        return None
    sets = members or {}
    missing = [i for i in np.flatnonzero(is_member) if i not in sets]
    if missing:
        raise NotSupported(f"{op}: BRANCH_MEMBER node {missing[0]} has no membership set")
    width = max((len(s) for s in sets.values()), default=1) or 1
    table = np.full((total, width), np.nan, dtype=dt)
    for i, s in sets.items():
        table[i, : len(s)] = s
    return table


def from_attributes(node: Any, prefix: str, dtype: Any, n_targets: int) -> Forest:
    """The ml-opset 1/3 form (``nodes_*`` keyed by tree and node id, ``<prefix>_*`` weights)."""
    from .misc import str_list
    from .ml_common import floats, ints

    op = node.op_type
    tree = ints(node, "nodes_treeids", True)
    node_id = ints(node, "nodes_nodeids", True)
    feature = ints(node, "nodes_featureids", True)
    true_id = ints(node, "nodes_truenodeids", True)
    false_id = ints(node, "nodes_falsenodeids", True)
    values = floats(node, "nodes_values")
    names = str_list(node.attr("nodes_modes", None))
    n = len(tree)
    if values is None:
        values = np.zeros(n)
    for name, arr in (
        ("nodes_nodeids", node_id),
        ("nodes_featureids", feature),
        ("nodes_truenodeids", true_id),
        ("nodes_falsenodeids", false_id),
        ("nodes_values", values),
        ("nodes_modes", names),
    ):
        if len(arr) != n:
            raise NotSupported(
                f"{op}: {name} has {len(arr)} entries but nodes_treeids has {n}; "
                "the nodes_* attributes must have one entry per node"
            )
    unknown = sorted({m for m in names if m not in MODES or MODES[m] == MEMBER})
    if unknown:
        raise NotSupported(f"{op}: node mode {unknown[0]!r} is not one of BRANCH_*, LEAF")
    mode = np.array([MODES[m] for m in names], np.int64).reshape(-1)
    tracks = ints(node, "nodes_missing_value_tracks_true")
    nan_true = np.zeros(n, bool)
    nan_true[: min(n, len(tracks))] = tracks[:n] == 1

    position: dict[tuple[int, int], int] = {}
    for i, key in enumerate(zip(tree.tolist(), node_id.tolist())):
        if key in position:
            raise NotSupported(f"{op}: node {key[1]} of tree {key[0]} is defined twice")
        position[key] = i
    inner = mode != LEAF
    n_inner = int(inner.sum())
    number = np.empty(n, np.int64)  # attribute position -> flat numbering
    number[inner] = np.arange(n_inner)
    number[~inner] = n_inner + np.arange(n - n_inner)

    def child(ids: np.ndarray, which: str) -> np.ndarray:
        out = np.empty(n_inner, np.int64)
        for k, i in enumerate(np.flatnonzero(inner).tolist()):
            key = (int(tree[i]), int(ids[i]))
            j = position.get(key)
            if j is None:
                raise NotSupported(
                    f"{op}: node {int(node_id[i])} of tree {key[0]} has {which} node "
                    f"{key[1]}, which the tree does not define"
                )
            if j == i:
                raise NotSupported(f"{op}: node {key[1]} of tree {key[0]} is its own {which} node")
            out[k] = number[j]
        return out

    starts = np.flatnonzero(np.concatenate([[True], tree[1:] != tree[:-1]])) if n else []
    w_tree = ints(node, f"{prefix}_treeids")
    w_node = ints(node, f"{prefix}_nodeids")
    w_id = ints(node, f"{prefix}_ids")
    w_val = floats(node, f"{prefix}_weights")
    w_val = np.zeros(0) if w_val is None else w_val
    if not (len(w_tree) == len(w_node) == len(w_id) == len(w_val)):
        raise NotSupported(
            f"{op}: {prefix}_treeids, {prefix}_nodeids, {prefix}_ids and {prefix}_weights "
            "must have one entry per weight"
        )
    leaf, target, weight = [], [], []
    for k, key in enumerate(zip(w_tree.tolist(), w_node.tolist())):
        j = position.get(key)
        if j is None:
            raise NotSupported(f"{op}: a weight names node {key[1]} of tree {key[0]}, undefined")
        if inner[j]:
            continue  # onnxruntime ignores weights on branch nodes (old onnxmltools wrote them)
        leaf.append(number[j] - n_inner)
        target.append(int(w_id[k]))
        weight.append(w_val[k])
    leaf_arr = np.asarray(leaf, np.int64)
    if n - n_inner and np.bincount(leaf_arr, minlength=n - n_inner).min() == 0:
        raise NotSupported(f"{op}: a leaf has no {prefix}_weights entry")
    # onnxruntime keeps weights in the threshold type: float32 unless the input is double.
    weight_arr = np.asarray(weight, dtype=np.dtype(dtype)).astype(np.float64)
    nodes = Nodes(
        op=op,
        feature=feature[inner],
        threshold=values[inner],
        mode=mode[inner],
        true_child=child(true_id, "true"),
        false_child=child(false_id, "false"),
        nan_true=nan_true[inner],
        roots=number[np.asarray(starts, np.int64)],
        n_leaves=n - n_inner,
        leaf=leaf_arr,
        target=np.asarray(target, np.int64),
        weight=weight_arr,
        n_targets=n_targets,
    )
    return Forest(nodes, dtype)


_F64, _F32 = np.dtype(np.float64), np.dtype(np.float32)


def compare_dtype(x_dtype: Any) -> np.dtype:
    """Thresholds and inputs compare in float64 for double inputs, else in float32."""
    return _F64 if x_dtype == _F64 else _F32
