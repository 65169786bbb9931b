"""Fixed-size states (recurrent, conv) updated where they are: ``onnxep.providers.inplace``.

A kernel registered with ``inplace`` may write its output over an input only
when the caller gave that buffer up for the run: IO binding bound it as both
the graph input and the paired graph output. The fake device here runs the
CPU kernels and, like the CUDA kernels, hands the past buffer back as present
when :func:`may_overwrite` says so; ``onnxep.generate`` binds each such state
once, and nothing is copied back per step, eager or captured.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_generate import (
    MODELS,
    PROMPT,
    CapturingPlugin,
    FakePlugin,
    step_by_step,
)

import onnxep
from onnxep.generation.greedy import SHARED, GreedyDecoder
from onnxep.generation.spec import decode_spec, model_dims
from onnxep.plugins.host import unregister_plugin
from onnxep.providers import hookimpl, kernel
from onnxep.providers.inplace import array_address, donating, may_overwrite, not_donating
from onnxep.providers.ops.op_causal_conv_with_state import causal_conv_with_state as cpu_conv
from onnxep.providers.ops.op_linear_attention import linear_attention as cpu_la

HYBRID = MODELS["qwen3_5_hybrid"]
_FLOATS = ("float", "float16")
UPDATED: list[str] = []  # node names whose state was written over the past buffer


def _over_past(node, inner, past_index: int):
    def run(*ins):
        outs = list(inner(*ins))
        past = ins[past_index] if len(ins) > past_index else None
        if (
            past is not None
            and outs[1].shape == past.shape
            and outs[1].dtype == past.dtype
            and may_overwrite(node.name, past)
        ):
            past[...] = outs[1]
            outs[1] = past
            UPDATED.append(node.name)
        return tuple(outs)

    return run


@kernel("LinearAttention", domain="com.microsoft", dtypes={0: _FLOATS}, inplace=((3, 1),))
def updating_la(node, xp):
    return _over_past(node, cpu_la(node, xp), 3)


@kernel("CausalConvWithState", domain="com.microsoft", dtypes={0: _FLOATS}, inplace=((3, 1),))
def updating_conv(node, xp):
    return _over_past(node, cpu_conv(node, xp), 3)


def _with_updating(plugin_cls):
    class Plugin(plugin_cls):
        @hookimpl
        def onnxep_kernels(self, provider):
            specs = super().onnxep_kernels(provider)
            if specs is None:
                return None
            extra = [*updating_la.__onnxep_kernels__, *updating_conv.__onnxep_kernels__]
            keys = {s.key for s in extra}
            return [s for s in specs if s.key not in keys] + extra

    return Plugin(share=True)


@pytest.fixture(params=["eager", "captured"])
def updating(request):
    plugin = _with_updating(FakePlugin if request.param == "eager" else CapturingPlugin)
    onnxep.register_provider(plugin, name="fakedev-updating-plugin")
    UPDATED.clear()
    yield request.param
    unregister_plugin(plugin)


def _fixed_states(sess):
    return [
        s for s in decode_spec(sess.get_inputs(), sess.get_outputs()).states if s.grow_axis is None
    ]


def test_the_session_pairs_each_fixed_state_with_its_present(updating):
    sess = onnxep.InferenceSession(HYBRID, providers=["fakedev"])
    fixed = _fixed_states(sess)
    assert fixed, "the hybrid test model has conv and recurrent states"
    pairs = sess.inplace_pairs()
    # the GroupQueryAttention caches are paired too (the fake GQA declares its sharing)
    assert {k: v for k, v in pairs.items() if "key" not in k and "value" not in k} == {
        s.name: s.output for s in fixed
    }
    # of the CPU provider's kernels only GroupQueryAttention declares in-place pairs
    cpu = onnxep.InferenceSession(HYBRID, providers=["cpu"]).inplace_pairs()
    assert cpu and all(k.endswith((".key", ".value")) for k in cpu), cpu


def test_generate_updates_fixed_states_in_place_and_copies_nothing(updating):
    sess = onnxep.InferenceSession(HYBRID, providers=["fakedev"])
    steps = 10
    dec = GreedyDecoder(sess, PROMPT, steps, capacity=24, dims=model_dims(HYBRID))
    assert dec.state_path == SHARED and "updated in place" in dec.state_note, dec.state_note
    fixed = _fixed_states(sess)
    first = {s.name: dec.states[s.name] for s in fixed}
    while not dec.done:
        dec.step()
    res = dec.finish()
    assert res.tokens == step_by_step(HYBRID, PROMPT, steps)
    # every state stayed in its one buffer, written by the kernels: no copy back per run
    assert res.copied_outputs == [0] * steps
    for s in fixed:
        assert dec.states[s.name] is first[s.name] and np.abs(first[s.name]).max() > 0
    if updating == "captured":
        c = res.capture_stats
        assert c["captures"] == 1 and c["fallbacks"] == 0 and c["replays"] == steps - 4, c
        # replays copy only the host feeds (ids, mask, positions), never a state
        assert c["copies"] == c["replays"] * 3, c
    else:
        assert len(UPDATED) == steps * len(fixed)


def test_a_plain_run_never_writes_over_its_feeds(updating):
    """Donations come only from IO binding: ``run`` with the same arrays leaves them as given."""
    sess = onnxep.InferenceSession(HYBRID, providers=["fakedev"])
    dec = GreedyDecoder(sess, PROMPT, 2, capacity=12, dims=model_dims(HYBRID))
    feeds = {**dec.step_feeds(), **dec.states}
    fixed = [s.name for s in _fixed_states(sess)]
    before = {k: np.array(feeds[k], copy=True) for k in fixed}
    sess.run(None, feeds)
    sess.run(None, feeds)
    for k in fixed:
        np.testing.assert_array_equal(feeds[k], before[k], err_msg=k)
    assert UPDATED == []


def test_may_overwrite_checks_node_and_address():
    x = np.zeros(4, np.float32)
    assert not may_overwrite("n", x)
    with donating({"n": array_address(x)}):
        assert may_overwrite("n", x)
        assert not may_overwrite("m", x)
        assert not may_overwrite("n", x.copy())
        with not_donating():
            assert not may_overwrite("n", x)
        assert may_overwrite("n", x)
    assert not may_overwrite("n", x)
