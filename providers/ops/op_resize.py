"""Resize (opset 10 to 19): separable, one gather or one matmul per resized axis.

The per-axis indices and weights depend only on the input shape and the
host-side roi/scales/sizes, so they are built on the host once per distinct
combination and cached. :class:`ResizeAttrs` (a node's attributes and its
plan builder) is shared with the CUDA provider's kernel, which reads the
same tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from onnxep.errors import NotSupported
from onnxep.providers.kernel import kernel

from .nn import ResizePlan, apply_resize_plan, make_resize_plan, str_attr

_MODES = ("nearest", "linear", "cubic")


def _host(v):
    return None if v is None else np.asarray(v).reshape(-1)


def _key(v):
    return None if v is None else tuple(v.tolist())


@dataclass(frozen=True)
class ResizeAttrs:
    """What a Resize or Upsample node asks for; the defaults are Resize-10's and Upsample's
    (asymmetric coordinates, nearest rounds down). ``fixed_scales``: Upsample-7's attribute."""

    mode: str
    ctm: str = "asymmetric"
    nearest_mode: str = "simple"
    cubic_a: float = -0.75
    exclude_outside: bool = False
    extrapolation_value: float = 0.0
    antialias: bool = False
    axes: tuple[int, ...] | None = None
    policy: str = "stretch"
    fixed_scales: tuple[float, ...] | None = None

    def key(self, shape: tuple[int, ...], roi: Any, scales: Any, sizes: Any) -> tuple:
        """The cache key of a plan: the input shape and the host values, as tuples."""
        if scales is None and self.fixed_scales is not None:
            scales = self.fixed_scales
        return (tuple(shape), _key(_host(roi)), _key(_host(scales)), _key(_host(sizes)))

    def plan(self, key: tuple) -> ResizePlan:
        shape, roi, scales, sizes = key
        return make_resize_plan(
            shape,
            scales,
            sizes,
            roi,
            None if self.axes is None else list(self.axes),
            mode=self.mode,
            ctm=self.ctm,
            nearest_mode=self.nearest_mode,
            cubic_a=self.cubic_a,
            exclude_outside=self.exclude_outside,
            antialias=self.antialias,
            policy=self.policy,
        )


def legacy_attrs(mode: str, fixed_scales=None) -> ResizeAttrs:
    """Resize-10 and Upsample: scales only, asymmetric coordinates, nearest rounds down."""
    fixed = None if fixed_scales is None else tuple(float(v) for v in fixed_scales)
    return ResizeAttrs(mode, fixed_scales=fixed)


def resize_attrs(node) -> ResizeAttrs:
    """Resize-11 and later."""
    mode = str_attr(node, "mode", "nearest")
    if mode not in _MODES:
        raise NotSupported(f"Resize: mode {mode!r} is not supported (nearest, linear, cubic)")
    policy = str_attr(node, "keep_aspect_ratio_policy", "stretch")
    if policy not in ("stretch", "not_larger", "not_smaller"):
        raise NotSupported(f"Resize: keep_aspect_ratio_policy {policy!r} is not supported")
    axes = node.attr("axes", None)
    return ResizeAttrs(
        mode,
        ctm=str_attr(node, "coordinate_transformation_mode", "half_pixel"),
        nearest_mode=str_attr(node, "nearest_mode", "round_prefer_floor"),
        cubic_a=float(node.attr("cubic_coeff_a", -0.75)),
        exclude_outside=bool(node.attr("exclude_outside", 0)),
        extrapolation_value=float(node.attr("extrapolation_value", 0.0)),
        antialias=bool(node.attr("antialias", 0)) and mode != "nearest",
        axes=None if axes is None else tuple(int(a) for a in axes),
        policy=policy,
    )


def attrs_run(xp, attrs: ResizeAttrs):
    """``run(x, roi, scales, sizes)`` through the generic plan."""
    cache: dict = {}

    def run(x, roi=None, scales=None, sizes=None):
        key = attrs.key(x.shape, roi, scales, sizes)
        plan = cache.get(key)
        if plan is None:
            plan = cache[key] = attrs.plan(key)
        return (apply_resize_plan(xp, x, plan, attrs.extrapolation_value),)

    return run


def legacy_run(xp, mode: str, fixed_scales=None):
    """Resize-10 and Upsample: ``run(x, scales)``."""
    full = attrs_run(xp, legacy_attrs(mode, fixed_scales))

    def run(x, scales=None):
        return full(x, None, scales)

    return run


def resize_10_mode(node) -> str:
    mode = str_attr(node, "mode", "nearest")
    if mode not in ("nearest", "linear"):
        raise NotSupported(f"Resize-10: mode {mode!r} is not supported (nearest, linear)")
    return mode


@kernel("Resize", since=10, host_inputs=(1,))
def resize_10(node, xp):
    return legacy_run(xp, resize_10_mode(node))


@kernel("Resize", since=(11, 13, 18, 19), host_inputs=(1, 2, 3))
def resize(node, xp):
    return attrs_run(xp, resize_attrs(node))
