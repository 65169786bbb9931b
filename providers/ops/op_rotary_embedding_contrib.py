"""com.microsoft RotaryEmbedding and MRotaryEmbedding.

RotaryEmbedding takes position_ids of shape (1,) (a start offset), (B, S), or
- beyond onnxruntime, which rejects it - (3, B, S): the temporal/height/width
streams of multimodal RoPE (Qwen2-VL style). For 3-D ids the
``mrope_section`` attribute (three counts summing to rotary_dim/2) says which
stream feeds each cos/sin column; ``mrope_layout`` 0 keeps the sections
contiguous (Qwen2-VL, Qwen2.5-VL: [T..T H..H W..W]), 1 interleaves them
(Qwen3-VL, Qwen3.5: H on columns 1,4,7.., W on 2,5,8.., T elsewhere), as
transformers' ``apply_multimodal_rotary_pos_emb`` / ``apply_interleaved_mrope``
do. MRotaryEmbedding is the same kernel with 3-D ids required.
"""

from __future__ import annotations

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.bounds import check_positions, first_id_where, position_ids_where
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.attention import compute_dtype, rotate, widen

_FLOATS = ("float", "float16", "bfloat16")


def mrope_streams(section, layout: int, half: int) -> np.ndarray:
    """For each of the ``half`` cos/sin columns, the position stream (0=T, 1=H, 2=W) it reads."""
    out = np.zeros(half, dtype=np.int64)
    if layout == 0:
        pos = 0
        for stream, n in enumerate(section):
            for _ in range(int(n)):
                if pos < half:
                    out[pos] = stream
                pos += 1
    else:
        for stream in (1, 2):
            out[stream : min(int(section[stream]) * 3, half) : 3] = stream
    return out


@kernel("MRotaryEmbedding", since=1, domain="com.microsoft", dtypes=_FLOATS)
@kernel("RotaryEmbedding", since=1, domain="com.microsoft", dtypes=_FLOATS)
def rotary_embedding_contrib(node: NodeInfo, xp):
    interleaved = bool(node.attr("interleaved", 0))
    rot_attr = int(node.attr("rotary_embedding_dim", 0))
    num_heads = int(node.attr("num_heads", 0))
    scale = float(node.attr("scale", 1.0))
    section = node.attr("mrope_section", None)
    layout = int(node.attr("mrope_layout", 0))
    if node.op_type == "MRotaryEmbedding":
        if section is None:
            raise NotSupported("MRotaryEmbedding: the mrope_section attribute is required")
        # onnxruntime scales cos/sin only in MRotaryEmbedding
        cs_scale = scale
    else:
        cs_scale = 1.0
    if section is not None and len(section) != 3:
        raise NotSupported(
            f"RotaryEmbedding: mrope_section must hold 3 values, got {list(section)}"
        )
    if layout not in (0, 1):
        raise NotSupported(f"RotaryEmbedding: mrope_layout must be 0 or 1, got {layout}")
    if section is None and node.op_type == "RotaryEmbedding":
        # onnxruntime-genai's builder emits 3-D position_ids for Qwen3.5 without an
        # mrope_section; transformers' Qwen3.5 rotary then uses its defaults: sections
        # (11, 11, 10) in the interleaved layout. Text-only positions (three equal
        # rows) give the same result under any section.
        section, layout = (11, 11, 10), int(node.attr("mrope_layout", 1))
    streams_cache: dict[int, object] = {}

    def run(x, pos, cos, sin):
        ct = compute_dtype(x.dtype)
        half = cos.shape[-1]
        if x.ndim == 4:
            b, n, s, hd = x.shape
            xs = x  # (B, N, S, H): cos/sin broadcast as (B, 1, S, half)
        else:
            b, s, hid = x.shape
            hd = hid // num_heads if num_heads else 2 * half
            xs = xp.reshape(x, (b, s, hid // hd, hd))  # (B, S, N, H): cos/sin as (B, S, 1, half)
        rot = rot_attr or hd
        if pos.ndim == 3:
            if section is None:
                raise ValueError(
                    "RotaryEmbedding: 3-D position_ids need the mrope_section attribute"
                )
            if half not in streams_cache:
                streams_cache[half] = xp.asarray(mrope_streams(section, layout, half))
            st = streams_cache[half]
            ids = pos.astype(xp.int64)  # (3, B, S)
            check_positions(xp, ids, cos.shape[0], position_ids_where)
            c_all = xp.take(cos, xp.reshape(ids, (-1,)), axis=0)
            s_all = xp.take(sin, xp.reshape(ids, (-1,)), axis=0)
            c_all = xp.reshape(c_all, (3, b * s, half))
            s_all = xp.reshape(s_all, (3, b * s, half))
            sel = xp.broadcast_to(xp.reshape(st, (1, 1, half)), (1, b * s, half))
            c = xp.reshape(xp.take_along_axis(c_all, sel, axis=0), (b, s, half))
            sn = xp.reshape(xp.take_along_axis(s_all, sel, axis=0), (b, s, half))
        else:
            if pos.ndim == 2:
                ids, where = pos.astype(xp.int64), position_ids_where
            else:
                ids = xp.reshape(pos.astype(xp.int64), (1, 1))[:, :1] + xp.reshape(
                    xp.arange(s), (1, s)
                )
                ids, where = xp.broadcast_to(ids, (b, s)), first_id_where
            # rows of the cos/sin cache; negative ids do not count from its end
            check_positions(xp, ids, cos.shape[0], where)
            c = xp.reshape(xp.take(cos, xp.reshape(ids, (-1,)), axis=0), (b, s, half))
            sn = xp.reshape(xp.take(sin, xp.reshape(ids, (-1,)), axis=0), (b, s, half))
        c = widen(c, ct)
        sn = widen(sn, ct)
        if cs_scale != 1.0:
            c = c * ct.type(cs_scale)
            sn = sn * ct.type(cs_scale)
        if x.ndim == 4:
            c, sn = c[:, None], sn[:, None]
        else:
            c, sn = c[:, :, None], sn[:, :, None]
        y = rotate(xp, widen(xs, ct), c, sn, interleaved, rot).astype(x.dtype)
        return (xp.reshape(y, x.shape),)

    return run
