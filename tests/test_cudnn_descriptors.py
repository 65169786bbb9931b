"""cuDNN's own descriptors for every plan of tests/test_cudnn_plan.py's grids, without a GPU.

Descriptor setup and cuDNN's output-size queries run on the host, so where a libcudnn is
installed (``$ONNXEP_CUDNN_LIBRARY``, a wheel under site-packages; no GPU needed) this
checks the ctypes signatures and enum values of ``providers_cuda/dnn.py`` against the real
library: every Conv, ConvTranspose and pooling geometry is accepted, and cuDNN computes
the output shape the plan computed (the objects raise if it does not). Skipped, with the
loader's reason, where no libcudnn is found.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import test_cudnn_plan as G

from onnxep.providers.ops import op_conv_transpose as generic
from onnxep.providers_cuda import dnn, dnn_library
from onnxep.providers_cuda.ops import conv_plan as P


@pytest.fixture(scope="module", autouse=True)
def _cudnn():
    why = dnn_library.unavailable_reason()
    if why:
        pytest.skip(f"no libcudnn here: {why}")


DTYPES = ["float32", "float16", "float64"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", G.CONV_GRID, ids=lambda c: f"{len(c[0])}d-{c[4]}-g{c[5]}")
def test_conv_descriptors_agree_with_the_plan(case, dtype):
    sp, kernel, strides, dil, pads, group, (c, m) = case
    attrs = G.conv_attrs(kernel, strides, dil, pads, group)
    nsp = len(sp)
    pb = list(attrs.get("pads", [0] * 2 * nsp))
    g = P.conv_geometry(
        (2, c, *sp),
        (m, c // group, *kernel),
        group=group,
        kernel_shape=kernel,
        strides=strides,
        dilations=dil,
        pads_begin=pb[:nsp],
        pads_end=pb[nsp:],
        auto_pad=attrs.get("auto_pad", "NOTSET"),
    )
    conv = dnn.ConvForward(g, dtype)  # raises if cuDNN's output dims differ from the plan
    assert conv.y_shape == g.y_shape
    dnn.BiasAdd(g.y_shape, dtype)
    dnn.BiasAdd(g.out_shape, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", G.TRANSPOSE_GRID, ids=lambda c: f"{len(c[0])}d-{sorted(c[4])}")
def test_conv_transpose_descriptors_agree_with_the_plan(case, dtype):
    sp, kernel, strides, dil, extra, group, (c, mg) = case
    x = np.zeros((2, c, *sp), np.float32)
    w = np.zeros((c, mg, *kernel), np.float32)
    attrs = G.transpose_attrs(x, w, kernel, strides, dil, extra, group)
    node = G.node_info("ConvTranspose", attrs, [x, w])
    grp, ksh, st, dl, geometry = generic.conv_transpose_setup(node)
    full, pb, pe = geometry(list(sp), list(kernel))
    g = P.conv_transpose_geometry(
        x.shape, w.shape, group=grp, kernel_shape=ksh, strides=st, dilations=dl, full=full,
        pads_begin=pb, pads_end=pe,
    )  # fmt: skip
    op = dnn.ConvBackwardData(g, dtype)  # checks cuDNN's forward dims of dx against x
    assert op.x_shape == g.dx_shape and op.y_shape == g.x_shape


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", G.POOL_GRID, ids=lambda c: f"{c[0]}-{len(c[1])}d-{c[4]}-c{c[5]}")
def test_pool_descriptors_agree_with_the_plan(case, dtype):
    kind, sp, kernel, strides, pads, ceil, include = case
    attrs = G.pool_attrs(kernel, strides, pads, ceil, include, kind)
    g = G.pool_plan(kind, (2, 3, *sp), attrs)
    if isinstance(g, str):
        pytest.skip(g)
    pool = dnn.Pooling(g, dtype)  # raises if cuDNN's output dims differ
    assert pool.y_shape == g.y_shape


@pytest.mark.parametrize("sp", [(7,), (5, 6), (3, 4, 2), (20, 20)])
def test_global_pool_descriptors(sp):
    for kind in ("avg", "max"):
        g = P.global_pool_plan(kind, (2, 3, *sp))
        assert dnn.Pooling(g, "float32").y_shape == g.y_shape


def _geometry(x, w, pad):
    return P.conv_geometry(
        x,
        w,
        group=1,
        kernel_shape=None,
        strides=(1, 1),
        dilations=(1, 1),
        pads_begin=(pad, pad),
        pads_end=(pad, pad),
        auto_pad="NOTSET",
    )


def test_activation_descriptors():
    g = _geometry((1, 2, 5, 5), (3, 2, 3, 3), 1)
    conv = dnn.ConvForward(g, "float32")
    for mode, coef in ((dnn.ACT_RELU, 0.0), (dnn.ACT_CLIPPED_RELU, 6.0)):
        assert conv.activation(mode, coef).ptr


def test_a_shape_the_plan_got_wrong_is_caught_by_cudnn():
    g = _geometry((1, 2, 8, 8), (3, 2, 3, 3), 0)
    bad = replace(g, y_shape=(1, 3, 7, 6))
    with pytest.raises(dnn.DnnError, match="onnxep bug"):
        dnn.ConvForward(bad, "float32")


def test_a_bad_descriptor_raises_with_cudnns_message():
    with pytest.raises(dnn.DnnError, match=r"cudnnSetTensorNdDescriptor.*cuDNN status \d+"):
        dnn.BiasAdd((1, -3, 4, 4), "float32")
