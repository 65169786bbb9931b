"""The rewrite manager hands each guarded pass call the snapshot the previous one left.

One snapshot per fusion-pass call instead of two (``GraphState`` is the bulk of the
contract check's cost): the state after a kept pass, or the restored state after a
rolled-back one, is the next call's "before". These cases fail if that state were stale.
"""

from __future__ import annotations

import types

import onnx_ir as ir
from onnx import TensorProto, helper

from onnxep.providers.rewrite import FusionPass
from onnxep.rewrites import RewriteManager


class _Retype(FusionPass):
    """Turns every ``victim`` node into ``to`` (in place), once."""

    def __init__(self, name: str, victim: str, to: str) -> None:
        super().__init__()
        self.name, self.victim, self.to = name, victim, to

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        hit = [n for n in model.graph if n.op_type == self.victim]
        for n in hit:
            n.op_type = self.to
            self.count += 1
        return ir.passes.PassResult(model, bool(hit))


def _model() -> ir.Model:
    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("Neg", ["h"], ["y"])]
    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("x", "y")]
    return ir.from_proto(helper.make_model(helper.make_graph(nodes, "g", vi[:1], vi[1:])))


def _bound(p: FusionPass) -> FusionPass:
    """Bound to a provider that owns every node but the Neg, with a kernel for anything."""
    registry = types.SimpleNamespace(lookup=lambda *_: object())
    provider = types.SimpleNamespace(name="toy", registry=registry)
    p.bind(provider, lambda node: node.op_type != "Neg", {"": 17})
    return p


def test_a_rollback_returns_to_the_kept_passes_state_and_later_passes_are_still_checked():
    model = _model()
    kept = _bound(_Retype("relu_to_abs", "Relu", "Abs"))
    rogue = _bound(_Retype("neg_to_sign", "Neg", "Sign"))
    later = _bound(_Retype("abs_to_elu", "Abs", "Elu"))
    rogue_again = _bound(_Retype("neg_to_floor", "Neg", "Floor"))
    report = RewriteManager([kept, rogue, later, rogue_again]).run(model)
    assert [r.name for r in report.rejected] == ["neg_to_sign", "neg_to_floor"]
    assert [n.op_type for n in model.graph] == ["Elu", "Neg"]
    assert report.counts == {"relu_to_abs": 1, "neg_to_sign": 0, "abs_to_elu": 1, "neg_to_floor": 0}


def test_an_unguarded_pass_between_guarded_ones_is_not_missed():
    class Unguarded(ir.passes.InPlacePass):
        name = "neg_to_sign"

        def call(self, model):
            for n in model.graph:
                n.op_type = "Sign" if n.op_type == "Neg" else n.op_type
            return ir.passes.PassResult(model, False)

    model = _model()
    first = _bound(_Retype("noop", "Tanh", "Elu"))
    # The Sign is owned (only a Neg is not): checked against a snapshot taken before the
    # unguarded pass, this rewrite would be of a Neg, and rolled back.
    second = _bound(_Retype("sign_to_floor", "Sign", "Floor"))
    report = RewriteManager([first, Unguarded(), second]).run(model)
    assert not report.rejected
    assert [n.op_type for n in model.graph] == ["Relu", "Floor"]
