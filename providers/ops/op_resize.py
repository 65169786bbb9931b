"""Resize (opset 10 to 19): separable, one gather or one matmul per resized axis.

The per-axis indices and weights depend only on the input shape and the
host-side roi/scales/sizes, so they are built on the host once per distinct
combination and cached.
"""

from __future__ import annotations

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel

from .nn import apply_resize_plan, make_resize_plan, str_attr

_MODES = ("nearest", "linear", "cubic")


def _host(v):
    return None if v is None else np.asarray(v).reshape(-1)


def _key(v):
    return None if v is None else tuple(v.tolist())


def legacy_run(xp, mode: str, fixed_scales=None):
    """Resize-10 and Upsample: scales only, asymmetric coordinates, nearest rounds down."""
    cache: dict = {}

    def run(x, scales=None):
        sc = _host(fixed_scales if scales is None else scales)
        key = (x.shape, _key(sc))
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


@kernel("Resize", since=10, host_inputs=(1,))
def resize_10(node, xp):
    mode = str_attr(node, "mode", "nearest")
    if mode not in ("nearest", "linear"):
        raise NotSupported(f"Resize-10: mode {mode!r} is not supported (nearest, linear)")
    return legacy_run(xp, mode)


@kernel("Resize", since=(11, 13, 18, 19), host_inputs=(1, 2, 3))
def resize(node, xp):
    mode = str_attr(node, "mode", "nearest")
    if mode not in _MODES:
        raise NotSupported(f"Resize: mode {mode!r} is not supported (nearest, linear, cubic)")
    ctm = str_attr(node, "coordinate_transformation_mode", "half_pixel")
    nearest_mode = str_attr(node, "nearest_mode", "round_prefer_floor")
    cubic_a = float(node.attr("cubic_coeff_a", -0.75))
    exclude = bool(node.attr("exclude_outside", 0))
    extrap = float(node.attr("extrapolation_value", 0.0))
    antialias = bool(node.attr("antialias", 0)) and mode != "nearest"
    axes = node.attr("axes", None)
    axes = None if axes is None else [int(a) for a in axes]
    policy = str_attr(node, "keep_aspect_ratio_policy", "stretch")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise NotSupported(f"Resize: keep_aspect_ratio_policy {policy!r} is not supported")
    cache: dict = {}

    def run(x, roi=None, scales=None, sizes=None):
        r, s, z = _host(roi), _host(scales), _host(sizes)
        key = (x.shape, _key(r), _key(s), _key(z))
        plan = cache.get(key)
        if plan is None:
            plan = cache[key] = make_resize_plan(
                x.shape,
                s,
                z,
                r,
                axes,
                mode=mode,
                ctm=ctm,
                nearest_mode=nearest_mode,
                cubic_a=cubic_a,
                exclude_outside=exclude,
                antialias=antialias,
                policy=policy,
            )
        return (apply_resize_plan(xp, x, plan, extrap),)

    return run
