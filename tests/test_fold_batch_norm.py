"""fold_batch_norm: an inference-mode BatchNormalization (and per-channel Mul/Add) folded into
the Conv before it, on torch exports that keep the BN node, against onnxruntime and against
the unfused session; the refusals leave the graph as it was and say why in the report."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper, numpy_helper

import onnxep
from onnxep.rewrites.fold_batch_norm import (
    STATS_NOT_CONSTANT,
    TRAINING_MODE,
    TRAINING_OUTPUTS,
)
from onnxep.testing import compare_output

torch = pytest.importorskip("torch")

OFF = ["fold_batch_norm"]


def export(module, x) -> onnx.ModelProto:
    """``module`` in eval mode, exported without constant folding, so BatchNormalization stays
    (the TorchScript exporter folds it into the Conv otherwise)."""
    module.eval()
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), f, dynamo=False, do_constant_folding=False)
    return onnx.load_from_string(f.getvalue())


def randomize_bn(bn, seed):
    """Statistics and affine parameters far from the identity, so the fold is not trivial."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        n = bn.num_features
        bn.running_mean.copy_(torch.randn(n, generator=g))
        bn.running_var.copy_(torch.rand(n, generator=g) * 2 + 0.1)
        bn.weight.copy_(torch.randn(n, generator=g))
        bn.bias.copy_(torch.randn(n, generator=g))


class ConvBN(torch.nn.Module):
    def __init__(self, dim, cin, cout, groups=1, bias=True, **kw):
        super().__init__()
        conv = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)[dim - 1]
        bn = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d, torch.nn.BatchNorm3d)[dim - 1]
        self.conv = conv(cin, cout, 3, groups=groups, bias=bias, **kw)
        self.bn = bn(cout, eps=1e-3)
        randomize_bn(self.bn, cout + dim)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def ops(model) -> list[str]:
    return [n.op_type for n in model.graph.node]


def session_ops(sess) -> list[str]:
    return [n.op_type for n in sess.compiled.model.graph]


def check_parity(model, feeds, sess):
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    opts = onnxep.SessionOptions(disabled_rewrites=OFF)
    unfused = onnxep.InferenceSession(model, opts, providers=["cpu"])
    got = sess.run(None, feeds)
    for g, want in zip(got, ref.run(None, feeds)):
        [r] = compare_output("y", g, want, ["cpu"], "onnxruntime")
        assert r.ok, r
    for g, want in zip(got, unfused.run(None, feeds)):
        [r] = compare_output("y", g, want, ["cpu"], "unfused")
        assert r.ok, r
    return unfused


CASES = {
    "conv2d": (ConvBN(2, 3, 8, padding=1), [2, 3, 12, 12]),
    "conv2d-no-bias": (ConvBN(2, 4, 6, bias=False, stride=2), [1, 4, 11, 9]),
    "conv1d-dilated": (ConvBN(1, 5, 7, dilation=2, padding=2), [2, 5, 30]),
    "conv3d": (ConvBN(3, 2, 4, padding=1), [1, 2, 6, 5, 4]),
    "grouped": (ConvBN(2, 8, 12, groups=4, padding=1), [1, 8, 9, 9]),
    "depthwise": (ConvBN(2, 6, 6, groups=6, bias=False), [2, 6, 10, 10]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_torch_conv_batchnorm_folds(case, rng):
    module, shape = CASES[case]
    x = torch.randn(*shape)
    model = export(module, x)
    assert "BatchNormalization" in ops(model)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    assert "BatchNormalization" not in session_ops(sess)
    # one Conv left (a FusedConv where the CPU provider then fuses the ReLU after it)
    assert sum(session_ops(sess).count(op) for op in ("Conv", "FusedConv")) == 1
    rep = sess.placement()
    assert rep.rewrites["fold_batch_norm"] == 1
    assert "fold_batch_norm" not in rep.rewrite_refusals
    feeds = {model.graph.input[0].name: rng.standard_normal(shape).astype(np.float32)}
    unfused = check_parity(model, feeds, sess)
    assert "BatchNormalization" in session_ops(unfused)
    assert unfused.placement().rewrites.get("fold_batch_norm", 0) == 0
    assert "fold_batch_norm" in unfused.placement().skipped_rewrites
    with torch.no_grad():
        want = module(torch.from_numpy(feeds[model.graph.input[0].name])).numpy()
    np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)


class ConvAffine(torch.nn.Module):
    """A frozen batch norm as some exporters write it: Conv, then Mul and Add by [1, C, 1, 1]."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 5, 3)
        g = torch.Generator().manual_seed(3)
        self.register_buffer("scale", torch.randn(1, 5, 1, 1, generator=g))
        self.register_buffer("shift", torch.randn(5, 1, 1, generator=g))

    def forward(self, x):
        return self.conv(x) * self.scale + self.shift


def test_per_channel_mul_and_add_fold(rng):
    x = torch.randn(2, 3, 8, 8)
    model = export(ConvAffine(), x)
    assert ops(model).count("Mul") == 1 and ops(model).count("Add") == 1
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    assert session_ops(sess) == ["Conv"]
    assert sess.placement().rewrites["fold_batch_norm"] == 2
    check_parity(model, {model.graph.input[0].name: x.numpy()}, sess)


def test_a_residual_add_is_no_match(rng):
    """Conv + a tensor that is not a per-channel constant: left alone, and no refusal."""
    w = numpy_helper.from_array(rng.standard_normal([4, 4, 1, 1]).astype(np.float32), "w")
    c = numpy_helper.from_array(rng.standard_normal([1, 4, 5, 1]).astype(np.float32), "c")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["h"], name="conv"),
        helper.make_node("Add", ["h", "x"], ["r"], name="residual"),
        helper.make_node("Conv", ["r", "w"], ["h2"], name="conv2"),
        helper.make_node("Mul", ["h2", "c"], ["y"], name="not_per_channel"),
    ]
    model = make_model(nodes, [tensor("x", [1, 4, 5, 5])], [tensor("y", [1, 4, 5, 5])], [w, c])
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    assert session_ops(sess) == ["Conv", "Add", "Conv", "Mul"]
    assert sess.placement().rewrites["fold_batch_norm"] == 0
    assert sess.placement().rewrite_refusals == {}


# -- refusals ---------------------------------------------------------------------------


class ConvBNTwice(torch.nn.Module):
    """The Conv's output is read by the BN and returned as well."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        randomize_bn(self.bn, 1)

    def forward(self, x):
        h = self.conv(x)
        return self.bn(h), torch.sigmoid(h)


def refused_as(sess, reason):
    rep = sess.placement()
    assert rep.rewrites["fold_batch_norm"] == 0
    [(got_reason, nodes)] = rep.rewrite_refusals["fold_batch_norm"].items()
    assert got_reason == reason
    assert len(nodes) == 1
    assert f"fold_batch_norm refused 1 x {reason}" in rep.format()
    return nodes[0]


def test_conv_output_read_twice_is_refused(rng):
    x = torch.randn(1, 3, 7, 7)
    model = export(ConvBNTwice(), x)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    assert "BatchNormalization" in session_ops(sess)
    unfused = check_parity(model, {model.graph.input[0].name: x.numpy()}, sess)
    assert session_ops(sess) == session_ops(unfused)
    refused_as(sess, "an intermediate has another consumer")


def bn_model(mean_is_input=False, training=False, rng=None):
    c = 3
    w = numpy_helper.from_array(rng.standard_normal([c, 2, 3, 3]).astype(np.float32), "w")
    scale = numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "scale")
    bias = numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "bias")
    mean = numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "mean")
    var = numpy_helper.from_array((rng.random(c) + 0.5).astype(np.float32), "var")
    inits = [w, scale, bias, var] + ([] if mean_is_input else [mean])
    inputs = [tensor("x", [2, 2, 6, 6])] + ([tensor("mean", [c])] if mean_is_input else [])
    outputs = [tensor("y", [2, c, 4, 4])]
    bn_out = ["y"]
    attrs = {}
    if training:
        bn_out += ["running_mean", "running_var"]
        outputs += [tensor("running_mean", [c]), tensor("running_var", [c])]
        attrs["training_mode"] = 1
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["h"], name="conv"),
        helper.make_node(
            "BatchNormalization", ["h", "scale", "bias", "mean", "var"], bn_out, name="bn", **attrs
        ),
    ]
    return make_model(nodes, inputs, outputs, inits, opset=15)


def test_non_constant_statistics_are_refused(rng):
    model = bn_model(mean_is_input=True, rng=rng)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    assert session_ops(sess) == ["Conv", "BatchNormalization"]
    assert refused_as(sess, STATS_NOT_CONSTANT) == "bn"
    feeds = {
        "x": rng.standard_normal([2, 2, 6, 6]).astype(np.float32),
        "mean": rng.standard_normal(3).astype(np.float32),
    }
    check_parity(model, feeds, sess)


def test_training_outputs_are_refused(rng):
    model = bn_model(training=True, rng=rng)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    assert session_ops(sess) == ["Conv", "BatchNormalization"]
    assert refused_as(sess, TRAINING_OUTPUTS) == "bn"
    opts = onnxep.SessionOptions(disabled_rewrites=OFF)
    unfused = onnxep.InferenceSession(model, opts, providers=["cpu"])
    feeds = {"x": rng.standard_normal([2, 2, 6, 6]).astype(np.float32)}
    for got, want in zip(sess.run(None, feeds), unfused.run(None, feeds)):
        np.testing.assert_array_equal(got, want)


def test_training_mode_without_outputs_is_refused(rng):
    model = bn_model(rng=rng)
    model.graph.node[1].attribute.append(helper.make_attribute("training_mode", 1))
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    assert session_ops(sess) == ["Conv", "BatchNormalization"]
    assert refused_as(sess, TRAINING_MODE) == "bn"


def test_the_switch_turns_it_off(rng, tmp_path):
    module, shape = CASES["conv2d"]
    model = export(module, torch.randn(*shape))
    cfg = tmp_path / "plugins.toml"
    cfg.write_text("[rewrites]\nfold_batch_norm = false\n")
    sess = onnxep.InferenceSession(
        model, onnxep.SessionOptions(plugins_config=str(cfg)), providers=["cpu"]
    )
    assert "BatchNormalization" in session_ops(sess)
    assert "fold_batch_norm" in sess.placement().skipped_rewrites


def test_float16_folds_within_tolerance(rng):
    """Weights folded in float64 and cast back once: fp16 stays within the kit's tolerance."""
    model = bn_model(rng=rng)
    for init in model.graph.initializer:
        arr = numpy_helper.to_array(init).astype(np.float16)
        init.CopyFrom(numpy_helper.from_array(arr, init.name))
    for v in [*model.graph.input, *model.graph.output]:
        v.type.tensor_type.elem_type = TensorProto.FLOAT16
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    assert session_ops(sess) == ["Conv"]
    feeds = {"x": rng.standard_normal([2, 2, 6, 6]).astype(np.float16)}
    check_parity(model, feeds, sess)


def test_the_factory_resnet_with_its_batch_norms(rng):
    """The project's ResNet-style CNN (bench/factory), batch norms kept by the export: every
    Conv -> BN pair folds, including the projection shortcuts, and the Add of a residual
    branch stays (or becomes a FusedConv's Z)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.factory.torch_models import ResNet

    torch.manual_seed(0)
    net = ResNet()
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            randomize_bn(m, int(m.num_features))
    x = torch.randn(2, 3, 32, 32)
    model = export(net, x)
    n_bn = ops(model).count("BatchNormalization")
    assert n_bn == ops(model).count("Conv") == 9
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    assert "BatchNormalization" not in session_ops(sess)
    assert sess.placement().rewrites["fold_batch_norm"] == n_bn
    # each residual Add stays, or is the Z of a FusedConv (the CPU's Conv + Add + Relu)
    by_rule = next(f.by_rule for f in sess.placement().fusions if f.name == "fuse_conv_activation")
    fused_adds = by_rule.get("conv_add_relu", 0)
    assert session_ops(sess).count("Add") + fused_adds == ops(model).count("Add")
    check_parity(model, {model.graph.input[0].name: x.numpy()}, sess)


def test_folds_inside_an_if_branch(rng):
    """A Conv + BN in a subgraph folds too; the branch reads the outer graph's weights."""
    inner = bn_model(rng=rng)
    branch = helper.make_graph(
        list(inner.graph.node),
        "then",
        [],
        [tensor("y", [2, 3, 4, 4])],
        list(inner.graph.initializer),
    )
    other = helper.make_graph(
        [helper.make_node("Identity", ["zeros"], ["y2"], name="id")],
        "else",
        [],
        [tensor("y2", [2, 3, 4, 4])],
    )
    zeros = numpy_helper.from_array(np.zeros([2, 3, 4, 4], np.float32), "zeros")
    node = helper.make_node("If", ["cond"], ["y"], name="if", then_branch=branch, else_branch=other)
    model = make_model(
        [node],
        [tensor("x", [2, 2, 6, 6]), tensor("cond", [], TensorProto.BOOL)],
        [tensor("y", [2, 3, 4, 4])],
        [zeros],
        opset=15,
    )
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    assert sess.placement().rewrites["fold_batch_norm"] == 1
    then = sess.compiled.model.graph.node(0).attributes["then_branch"].value
    assert [n.op_type for n in then] == ["Conv"]
    feeds = {"x": rng.standard_normal([2, 2, 6, 6]).astype(np.float32), "cond": np.array(True)}
    check_parity(model, feeds, sess)


def test_the_dynamo_exporters_batch_norm_folds(rng):
    """torch's dynamo exporter writes the BN as BatchNormalization when its optimizer is off."""
    module, shape = CASES["grouped"]
    module.eval()
    x = torch.randn(*shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = torch.onnx.export(module, (x,), dynamo=True, optimize=False, verbose=False)
    model = model.model_proto
    assert "BatchNormalization" in ops(model)
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    assert "BatchNormalization" not in session_ops(sess)
    assert sess.placement().rewrites["fold_batch_norm"] == 1
    check_parity(model, {model.graph.input[0].name: x.numpy()}, sess)
