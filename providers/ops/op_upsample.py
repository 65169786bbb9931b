"""Upsample (deprecated; opset 7 scales attribute, opset 9 scales input): asymmetric resize."""

from __future__ import annotations

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel

from ._nn import apply_resize_plan, make_resize_plan, str_attr


def _builder(node, xp, attr_scales):
    mode = str_attr(node, "mode", "nearest")
    if mode == "bilinear":
        mode = "linear"
    if mode not in ("nearest", "linear"):
        raise NotSupported(f"Upsample: mode {mode!r} is not supported (nearest, linear)")
    cache: dict = {}

    def run(x, scales=None):
        sc = attr_scales if scales is None else np.asarray(scales).reshape(-1)
        key = (x.shape, tuple(float(v) for v in sc))
        plan = cache.get(key)
        if plan is None:
            plan = cache[key] = make_resize_plan(
                x.shape,
                sc,
                None,
                None,
                None,
                mode=mode,
                ctm="asymmetric",
                nearest_mode="simple",
                cubic_a=-0.75,
                exclude_outside=False,
                antialias=False,
            )
        return (apply_resize_plan(xp, x, plan),)

    return run


@kernel("Upsample", since=7)
def upsample_7(node, xp):
    return _builder(node, xp, [float(v) for v in node.attr("scales")])


@kernel("Upsample", since=(9, 10), host_inputs=(1,))
def upsample_9(node, xp):
    return _builder(node, xp, None)
