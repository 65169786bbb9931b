"""com.microsoft SparseAttention: causal grouped-query attention under a block-sparse mask.

Phi-3-small's attention. Each head uses block layout ``head % num_layouts``, given in CSR
form (``block_row_indices``, ``block_col_indices``; negative column padding is ignored):
query position p sees key position j when j <= p and the layout's block
(p // sparse_block_size, j // sparse_block_size) is set. Batch entry b's keys are
``key_total_sequence_lengths[b]`` long, the last ``sequence_length`` of them this call's: they
are written into the (B, kv_heads, max_cache, H) caches at those positions (with rotary
applied when ``do_rotary``, at the same positions as the queries) and the caches are the
presents. ``query`` may pack query, key and value.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from onnxep.errors import InvalidArgument, NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.ops._attention import default_scale, rotate, softmax_rows


def _layouts(rows: np.ndarray, cols: np.ndarray, op: str) -> np.ndarray:
    """(layouts, max_blocks, max_blocks) bool block masks from the CSR indices."""
    layouts, nb1 = rows.shape
    nb = nb1 - 1
    mask = np.zeros((layouts, nb, nb), bool)
    for lay in range(layouts):
        for r in range(nb):
            lo, hi = int(rows[lay, r]), int(rows[lay, r + 1])
            if not 0 <= lo <= hi <= cols.shape[1]:
                raise InvalidArgument(
                    f"{op}: block_row_indices of layout {lay} are not a CSR row index"
                )
            c = cols[lay, lo:hi]
            c = c[c >= 0]
            if c.size and c.max() >= nb:
                raise InvalidArgument(f"{op}: block_col_indices names block {c.max()} of {nb}")
            mask[lay, r, c] = True
    return mask


@kernel(
    "SparseAttention", since=1, domain="com.microsoft", dtypes={0: ("float", "float16", "bfloat16")}
)
def sparse_attention(node: Any, xp: Any):
    op = node.op_type
    nh, nkv = int(node.attr("num_heads")), int(node.attr("kv_num_heads"))
    block = int(node.attr("sparse_block_size"))
    scale_attr = float(node.attr("scale", 0.0) or 0.0)
    rotary = bool(node.attr("do_rotary", 0))
    interleaved = bool(node.attr("rotary_interleaved", 0))
    if nkv <= 0 or nh % nkv:
        raise NotSupported(f"{op}: num_heads {nh} is not a multiple of kv_num_heads {nkv}")

    def run(
        query, key, value, past_key, past_value, rows, cols, total_len, key_lens, cos=None, sin=None
    ):
        dt = query.dtype
        q = query.astype(np.float32)
        b, s, _ = q.shape
        cap, head = past_key.shape[2], past_key.shape[3]
        if key is None:
            q, k, v = np.split(q, [nh * head, (nh + nkv) * head], axis=-1)
        else:
            k, v = key.astype(np.float32), value.astype(np.float32)
        q = q.reshape(b, s, nh, head).transpose(0, 2, 1, 3)
        k = k.reshape(b, s, nkv, head).transpose(0, 2, 1, 3)
        v = v.reshape(b, s, nkv, head).transpose(0, 2, 1, 3)
        mask = _layouts(np.asarray(rows), np.asarray(cols), op)
        if nh % mask.shape[0]:
            raise InvalidArgument(f"{op}: {mask.shape[0]} layouts do not divide {nh} heads")
        lens = np.asarray(key_lens).reshape(-1).astype(np.int64)
        # total_sequence_length == sequence_length: the first call (a prompt, right-padded to
        # the longest row), where every row's keys start at position 0
        prompt = int(np.asarray(total_len).reshape(-1)[0]) == s
        low = 1 if prompt else s
        if lens.shape[0] != b or lens.min() < low or lens.max() > cap:
            raise InvalidArgument(
                f"{op}: key_total_sequence_lengths {lens.tolist()} must lie in [{low}, {cap}] "
                f"for each of the {b} batch entries"
            )
        pk = past_key.astype(np.float32, copy=True)
        pv = past_value.astype(np.float32, copy=True)
        scale = np.float32(scale_attr or default_scale(head))
        out = np.zeros((b, nh, s, head), np.float32)
        group = nh // nkv
        for i in range(b):
            total = int(lens[i])
            start = 0 if prompt else total - s
            pos = np.arange(start, start + s)
            qi, ki = q[i], k[i]
            if rotary:
                if cos is None or sin is None:
                    raise InvalidArgument(f"{op}: do_rotary=1 needs cos_cache and sin_cache")
                if pos.max() >= cos.shape[0]:
                    raise InvalidArgument(f"{op}: position {pos.max()} is past the rotary caches")
                c, sn = cos[pos].astype(np.float32)[None], sin[pos].astype(np.float32)[None]
                rot = 2 * cos.shape[1]
                qi, ki = (
                    rotate(np, qi, c, sn, interleaved, rot),
                    rotate(np, ki, c, sn, interleaved, rot),
                )
            pk[i, :, start : start + s] = ki
            pv[i, :, start : start + s] = v[i]
            keys, vals = pk[i, :, :total], pv[i, :, :total]
            j = np.arange(total)
            causal = j[None, :] <= pos[:, None]
            causal[total - start :] = False  # padding queries of a prompt attend to nothing
            for h in range(nh):
                lay = mask[h % mask.shape[0]]
                br, bc = pos // block, j // block
                if br.max() >= lay.shape[0] or bc.max(initial=0) >= lay.shape[1]:
                    raise InvalidArgument(f"{op}: position {pos.max()} is past the block layout")
                allowed = causal & lay[br[:, None], bc[None, :]]
                scores = qi[h] @ keys[h // group].T * scale
                scores = np.where(allowed, scores, -np.inf)
                out[i, h] = softmax_rows(np, scores) @ vals[h // group]
        y = out.transpose(0, 2, 1, 3).reshape(b, s, nh * head).astype(dt)
        return (y, pk.astype(dt), pv.astype(dt))

    return run
