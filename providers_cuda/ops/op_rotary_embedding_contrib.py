"""com.microsoft RotaryEmbedding and MRotaryEmbedding on CUDA.

The same semantics as the CPU kernel (``providers/ops/op_rotary_embedding_contrib.py``):
position ids of shape (1,) (a start offset), (B, S), or (3, B, S) for
multimodal RoPE with ``mrope_section``/``mrope_layout``; a 3-D input is
(B, S, hidden), a 4-D one (B, N, S, H). One kernel launch per call.
"""

from __future__ import annotations

from onnxep.errors import InvalidArgument, NotSupported
from onnxep.providers.kernel import kernel
from onnxep.providers.node import NodeInfo

from .rotary_cuda import PosMode, RopeKernel

_FLOATS = ("float", "float16")

#: transformers' Qwen3.5 defaults, as the CPU kernel uses for 3-D ids without a section.
_DEFAULT_SECTION = (11, 11, 10)


def parse_rotary_contrib(node: NodeInfo) -> dict:
    """The node's attributes, checked; raises NotSupported for what the kernel cannot run."""
    section = node.attr("mrope_section", None)
    layout = int(node.attr("mrope_layout", 0))
    if node.op_type == "MRotaryEmbedding" and section is None:
        raise NotSupported("MRotaryEmbedding: the mrope_section attribute is required")
    if section is not None and len(section) != 3:
        raise NotSupported(f"{node.op_type}: mrope_section must hold 3 values, got {list(section)}")
    if layout not in (0, 1):
        raise NotSupported(f"{node.op_type}: mrope_layout must be 0 or 1, got {layout}")
    if section is None:
        section, layout = _DEFAULT_SECTION, int(node.attr("mrope_layout", 1))
    return {
        "interleaved": bool(node.attr("interleaved", 0)),
        "rot": int(node.attr("rotary_embedding_dim", 0)),
        "num_heads": int(node.attr("num_heads", 0)),
        # onnxruntime scales cos/sin only in MRotaryEmbedding
        "cs_scale": float(node.attr("scale", 1.0)) if node.op_type == "MRotaryEmbedding" else 1.0,
        "section": tuple(int(v) for v in section),
        "layout": layout,
    }


@kernel("MRotaryEmbedding", since=1, domain="com.microsoft", dtypes=_FLOATS, capture_safe=True)
@kernel("RotaryEmbedding", since=1, domain="com.microsoft", dtypes=_FLOATS, capture_safe=True)
def rotary_embedding_contrib(node: NodeInfo, xp):
    cfg = parse_rotary_contrib(node)
    op = node.op_type
    rope = RopeKernel(node.input_dtype(0), op, node.name)
    interleaved, rot_attr, num_heads = cfg["interleaved"], cfg["rot"], cfg["num_heads"]
    section, layout, cs_scale = cfg["section"], cfg["layout"], cfg["cs_scale"]

    def run(x, pos, cos, sin):
        half = cos.shape[-1]
        if x.ndim == 4:
            b, n, s, hd = x.shape
            bnsd = True
        elif x.ndim == 3:
            b, s, hid = x.shape
            hd = hid // num_heads if num_heads else 2 * half
            if hd == 0 or hid % hd:
                raise InvalidArgument(
                    f"{op}: hidden size {hid} is not a multiple of the head size {hd} "
                    "(set num_heads, or give cos/sin caches of head_size/2 columns)"
                )
            n = hid // hd
            bnsd = False
        else:
            raise InvalidArgument(f"{op}: input must be 3-D or 4-D, got shape {tuple(x.shape)}")
        if cos.ndim != 2:
            raise InvalidArgument(f"{op}: cos_cache must be 2-D, got shape {tuple(cos.shape)}")
        bcast = False
        if pos.ndim == 3:
            if pos.shape != (3, b, s):
                raise InvalidArgument(
                    f"{op}: 3-D position_ids must be (3, {b}, {s}), got {tuple(pos.shape)}"
                )
            mode = PosMode.MROPE
        elif pos.ndim == 2:
            if pos.shape not in ((b, s), (1, s)):
                raise InvalidArgument(
                    f"{op}: position_ids must be ({b}, {s}), got {tuple(pos.shape)}"
                )
            mode, bcast = PosMode.IDS, pos.shape[0] != b
        elif pos.size == 1:
            mode = PosMode.OFFSET
        else:
            raise InvalidArgument(
                f"{op}: position_ids of shape {tuple(pos.shape)} is not (1,), (B, S) or (3, B, S)"
            )
        y = rope(
            xp,
            x,
            cos,
            sin,
            pos,
            op=op,
            bnsd=bnsd,
            shape=(b, n, s, hd),
            rot=rot_attr or hd,
            interleaved=interleaved,
            mode=mode,
            bcast_b=bcast,
            section=section,
            mrope_layout=layout,
            cs_scale=cs_scale,
        )
        return (y,)

    return run
