"""``onnxep.generate``: greedy decoding, the shared-cache device path, capacity and progress.

The device path is exercised on the CPU through ``fakedev``, a provider
registered at run time whose "device arrays" are NumPy arrays: it runs the
CPU kernels, counts every transfer the plan or the decoder asks of it, and
(optionally) runs GroupQueryAttention the way the CUDA kernel does, writing
the present into the past buffer and handing that buffer back. That tests
the fixed-capacity buffers, the mask and positions fed with them, IO
binding's no-copy hand-back, and the single token read per step. Whether a
real device keeps its outputs off the host is for tests/cuda/test_cuda_decode.py.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper, numpy_helper

import onnxep
from onnxep.errors import InvalidArgument
from onnxep.generation.greedy import FEED_BACK, SHARED, GreedyDecoder
from onnxep.generation.spec import DecodeState, decode_spec, model_dims
from onnxep.plugins.host import unregister_plugin
from onnxep.progress import progress_bar, wants_bar
from onnxep.providers import CaptureConfig, KernelLibrary, Provider, ProviderInfo, hookimpl, kernel
from onnxep.providers_cpu.ops.op_group_query_attention import (
    group_query_attention as cpu_gqa,
)

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
GENAI = DATA / "genai"
PROMPT = np.random.default_rng(3).integers(0, 500, 7)


def step_by_step(path: str, prompt: np.ndarray, tokens: int) -> list[int]:
    """The existing DecodeState loop on the CPU provider: the reference tokens."""
    sess = onnxep.InferenceSession(path, providers=["cpu"])
    spec = decode_spec(sess.get_inputs(), sess.get_outputs())
    names = [o.name for o in sess.get_outputs()]
    state = DecodeState(spec, len(prompt), prompt=prompt, dims=model_dims(path))
    for _ in range(tokens):
        state.advance(dict(zip(names, sess.run(None, state.feeds()))))
    return state.tokens


@pytest.fixture(scope="module")
def factory_tiny(tmp_path_factory) -> str:
    sys.path.insert(0, str(ROOT))  # bench/ is imported from the repo root, not installed
    from bench.factory import build_genai_decoder

    path = tmp_path_factory.mktemp("factory") / "model.onnx"
    build_genai_decoder("tiny", out_path=path, seed=2)
    return str(path)


MODELS = {
    "qwen2_fp32": str(GENAI / "qwen2_fp32" / "model.onnx"),
    "qwen2_int4": str(GENAI / "qwen2_int4" / "model.onnx"),
    "qwen3_5_hybrid": str(GENAI / "qwen3_5_fp32" / "model.onnx"),
    "torch_export": str(DATA / "llama_kv.onnx"),
}


def model_path(name: str, request) -> str:
    return request.getfixturevalue("factory_tiny") if name == "factory_tiny" else MODELS[name]


# -- the CPU provider -----------------------------------------------------------------------


@pytest.mark.parametrize("name", [*MODELS, "factory_tiny"])
def test_generate_matches_step_by_step_decode_on_cpu(name, request):
    path = model_path(name, request)
    sess = onnxep.InferenceSession(path, providers=["cpu"])
    res = onnxep.generate(sess, PROMPT, 10, progress=False)
    assert res.tokens == step_by_step(path, PROMPT, 10)
    assert res.token_ids.shape == (1, 10)
    assert res.state_path == FEED_BACK and res.capacity is None
    assert len(res.step_ms) == len(res.host_ms) == len(res.copied_outputs) == 10
    assert res.device_to_host_reads is None  # the CPU provider has no copies to count
    assert res.compute_nodes > 0 and res.tokens_per_second > 0


def test_a_batch_of_prompts_decodes_each_row():
    path = MODELS["qwen2_fp32"]
    sess = onnxep.InferenceSession(path, providers=["cpu"])
    prompts = np.stack([PROMPT, PROMPT[::-1]])
    res = onnxep.generate(sess, prompts, 6, progress=False)
    assert res.token_ids.shape == (2, 6)
    for row, prompt in zip(res.token_ids, prompts):
        assert row.tolist() == step_by_step(path, prompt, 6)


def test_capacity_smaller_than_the_decode_is_a_clear_error():
    sess = onnxep.InferenceSession(MODELS["qwen2_fp32"], providers=["cpu"])
    # 7 prompt tokens + 9 tokens fed back = 16 rows; the 10th token is never fed
    with pytest.raises(InvalidArgument, match=r"capacity 15 is too small.*16 rows.*>= 16"):
        onnxep.generate(sess, PROMPT, 10, capacity=15)
    assert onnxep.generate(sess, PROMPT, 10, capacity=16, progress=False).tokens


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_new_tokens": 0}, "max_new_tokens must be a positive integer"),
        ({"max_new_tokens": 2.5}, "max_new_tokens must be a positive integer"),
        ({"max_new_tokens": True}, "max_new_tokens must be a positive integer"),
        ({"capacity": 0}, "capacity must be a positive integer"),
        ({"input_ids": np.zeros((1, 3), np.float32)}, "input_ids must be token ids"),
        ({"input_ids": np.zeros((1, 0), np.int64)}, "at least one token"),
        ({"input_ids": np.zeros((1, 2, 3), np.int64)}, r"got int64 of shape \[1, 2, 3\]"),
    ],
)
def test_bad_arguments_are_named_and_leave_the_session_usable(kwargs, match):
    sess = onnxep.InferenceSession(MODELS["qwen2_fp32"], providers=["cpu"])
    args = {"input_ids": PROMPT, "max_new_tokens": 4, **kwargs}
    with pytest.raises(InvalidArgument, match=match):
        onnxep.generate(sess, **args)
    assert len(onnxep.generate(sess, PROMPT, 2, progress=False).tokens) == 2


def test_a_model_without_a_cache_is_refused():
    emb = numpy_helper.from_array(np.eye(8, dtype=np.float32), "emb")
    model = make_model(
        [helper.make_node("Gather", ["emb", "input_ids"], ["logits"])],
        [tensor("input_ids", ["b", "s"], TensorProto.INT64)],
        [tensor("logits", ["b", "s", 8])],
        [emb],
    )
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    with pytest.raises(InvalidArgument, match="KV cache"):
        onnxep.generate(sess, [1, 2], 3)


def test_a_symbolic_state_dim_without_its_value_is_named(tmp_path):
    # the genai model's head size comes from genai_config.json beside it; bytes have none
    data = (GENAI / "qwen2_fp32" / "model.onnx").read_bytes()
    import onnx

    proto = onnx.load_from_string(data)
    onnx.load_external_data_for_model(proto, str(GENAI / "qwen2_fp32"))
    sess = onnxep.InferenceSession(proto, providers=["cpu"])
    with pytest.raises(InvalidArgument, match=r"symbolic dim 'kv_cache_dim'.*dims="):
        onnxep.generate(sess, PROMPT, 3)
    res = onnxep.generate(sess, PROMPT, 3, dims={"kv_cache_dim": 64}, progress=False)
    assert res.tokens == step_by_step(MODELS["qwen2_fp32"], PROMPT, 3)


# -- the device path, on a fake device --------------------------------------------------------


@kernel(
    "GroupQueryAttention",
    since=1,
    domain="com.microsoft",
    dtypes={0: ("float", "float16")},
    host_inputs=(6,),
    inplace=((3, 1), (4, 2)),
)
def sharing_gqa(node, xp):
    """The CPU kernel, then the CUDA kernel's contract: present IS the past buffer when it fits."""
    inner = cpu_gqa(node, xp)

    def run(query, key=None, value=None, past_k=None, past_v=None, *rest):
        y, pk, pv, *more = inner(query, key, value, past_k, past_v, *rest)
        if past_k is not None and pk.shape == past_k.shape:
            past_k[...] = pk
            past_v[...] = pv
            return (y, past_k, past_v, *more)
        return (y, pk, pv, *more)

    return run


class FakeDevice(Provider):
    """NumPy arrays that play device arrays: transfers are counted, never copied."""

    def __init__(self, options):
        super().__init__("fakedev", options, device="fakedev", xp=np)
        self.counts = {"device_to_host": 0, "host_to_device": 0}

    def to_host(self, x):
        self.counts["device_to_host"] += 1
        return x

    def from_host(self, x):
        self.counts["host_to_device"] += 1
        return x

    def adopt(self, x):
        return x

    def transfer_counts(self):
        return dict(self.counts)


class FakePlugin:
    def __init__(self, share: bool) -> None:
        self.share = share

    @hookimpl
    def onnxep_provider_info(self):
        return ProviderInfo(name="fakedev", device="fakedev")

    @hookimpl
    def onnxep_create_provider(self, options):
        return FakeDevice(options)

    @hookimpl
    def onnxep_kernels(self, provider):
        if provider.name != "fakedev":
            return None
        import onnxep.providers_cpu.ops as cpu_ops

        specs = [
            *KernelLibrary.from_package("onnxep.providers.ops"),
            *KernelLibrary.from_package(cpu_ops),
        ]
        return specs + (list(sharing_gqa.__onnxep_kernels__) if self.share else [])


@pytest.fixture(params=[True, False], ids=["gqa-shares", "gqa-copies"])
def fakedev(request):
    plugin = FakePlugin(share=request.param)
    onnxep.register_provider(plugin, name="fakedev-plugin")
    yield request.param
    unregister_plugin(plugin)


@pytest.mark.parametrize("name", ["qwen2_fp32", "qwen3_5_hybrid", "factory_tiny"])
def test_device_path_binds_fixed_buffers_and_reads_one_token_per_step(fakedev, name, request):
    path = model_path(name, request)
    sess = onnxep.InferenceSession(path, providers=["fakedev"])
    assert sess.providers[0].device == "fakedev"
    steps = 9
    dec = GreedyDecoder(sess, PROMPT, steps, dims=model_dims(path))
    assert dec.state_path == SHARED, dec.state_note
    assert dec.capacity == len(PROMPT) + steps
    caches = [s for s in dec.spec.states if s.grow_axis is not None]
    first = {s.name: dec.states[s.name] for s in caches}
    while not dec.done:
        dec.step()
    res = dec.finish()
    assert res.tokens == step_by_step(path, PROMPT, steps)
    # one device-to-host read per run: the token ids, from an argmax on the device
    assert res.device_to_host_reads == [1] * steps
    # the cache is one buffer per state for the whole decode, filled row by row
    for s in caches:
        buf = dec.states[s.name]
        assert buf is first[s.name] and buf.shape[s.grow_axis] == dec.capacity
        rows = np.moveaxis(buf, s.grow_axis, 0)
        filled = len(PROMPT) + steps - 1
        assert np.abs(rows[:filled]).max() > 0 and not rows[filled:].any()
    # a kernel that writes into the bound past buffer hands it back: nothing is copied (the
    # CPU kernel too, since it writes a decode token into a buffer IO binding gave up)
    assert res.copied_outputs == [0] * steps


@pytest.mark.parametrize("name", ["qwen2_fp32", "qwen2_int4", "qwen3_5_hybrid", "factory_tiny"])
def test_full_capacity_mask_on_shared_host_buffers_gives_the_growing_decode(name, request):
    """The CPU GroupQueryAttention with the device's path: the past buffer bound as the
    present, a mask of the buffers' capacity (zeros after the filled rows)."""
    path = model_path(name, request)
    sess = onnxep.InferenceSession(path, providers=["cpu"])
    grown = onnxep.generate(sess, PROMPT, 9, progress=False)
    assert grown.state_path == FEED_BACK and not grown.full_mask
    dec = GreedyDecoder(sess, PROMPT, 9, capacity=40, dims=model_dims(path), share_on_host=True)
    assert dec.state_path == SHARED and dec.full_mask, dec.state_note
    masks = []
    while not dec.done:
        feeds = dec.step_feeds()
        masks.append(feeds[dec.spec.mask])
        dec.step()
    assert dec.finish().tokens == grown.tokens
    assert masks[0].shape == (1, len(PROMPT)) and masks[0].all()
    for k, m in enumerate(masks[1:], start=1):
        assert m.shape == (1, 40) and int(m.sum()) == len(PROMPT) + k and m[0, : int(m.sum())].all()


def test_share_on_host_refuses_a_cache_no_kernel_shares():
    sess = onnxep.InferenceSession(MODELS["torch_export"], providers=["cpu"])
    with pytest.raises(InvalidArgument, match="share_on_host.*Concat"):
        GreedyDecoder(sess, PROMPT, 4, share_on_host=True)
    assert len(onnxep.generate(sess, PROMPT, 2, progress=False).tokens) == 2


def test_device_path_feeds_full_capacity_masks_after_the_prefill(fakedev):
    path = MODELS["qwen2_fp32"]
    sess = onnxep.InferenceSession(path, providers=["fakedev"])
    res = onnxep.generate(sess, PROMPT, 6, capacity=64, progress=False)
    assert res.state_path == SHARED and res.full_mask and res.capacity == 64
    assert res.tokens == step_by_step(path, PROMPT, 6)
    assert res.capture_stats["policy"] == "off" and res.capture_stats["replays"] == 0


def test_device_path_feeds_back_a_cache_no_kernel_shares(fakedev):
    path = MODELS["torch_export"]  # present = Concat(past, new)
    sess = onnxep.InferenceSession(path, providers=["fakedev"])
    res = onnxep.generate(sess, PROMPT, 8, capacity=100, progress=False)
    assert res.state_path == FEED_BACK and res.capacity is None
    assert "Concat" in res.state_note
    assert res.tokens == step_by_step(path, PROMPT, 8)
    assert res.device_to_host_reads == [1] * 8 and res.copied_outputs == [0] * 8


# -- captured decode, on a fake device that "captures" by recording the run ----------------


class _FakeGraph:
    def __init__(self, run, state, outputs):
        self.run, self.state, self.outputs, self.fresh = run, state, list(outputs), True


class _FakeGraphBackend:
    """A replay re-runs the recorded steps on the buffers they were recorded with, as a
    CUDA graph does; the runner's staging copies host feeds into those buffers first, and
    IO binding's shared KV buffers are among the recorded ones, read in place."""

    def memory(self):
        return type("Mem", (), {"allocating": staticmethod(contextlib.nullcontext)})()

    def capture(self, run, state, outputs):
        run()
        return _FakeGraph(run, state, outputs)

    def constant(self, value, memory):
        return value

    def launch(self, g):
        if g.fresh:  # the capture ran the steps already
            g.fresh = False
            return
        kept = {s: g.state[s] for s in g.outputs if g.state[s] is not None}
        g.run()
        for s, buf in kept.items():
            np.copyto(buf, g.state[s])
            g.state[s] = buf

    def fixed(self, value):
        return np.array(value, copy=True)

    def copy_into(self, dst, src):
        np.copyto(dst, src)

    def duplicate(self, value):
        return np.array(value, copy=True)

    def is_device(self, value):
        return isinstance(value, np.ndarray)

    def address(self, value):
        return value.ctypes.data


class CapturingPlugin(FakePlugin):
    @hookimpl
    def onnxep_capture_policy(self, provider, options):
        if provider.name != "fakedev":
            return None
        return CaptureConfig(
            mode=options.get("capture", "auto"),
            backend=_FakeGraphBackend,
            capturing=frozenset({"fakedev"}),
        )


@pytest.fixture
def capturing():
    plugin = CapturingPlugin(share=True)
    onnxep.register_provider(plugin, name="fakedev-capture-plugin")
    yield
    unregister_plugin(plugin)


@pytest.mark.parametrize("name", ["qwen2_fp32", "factory_tiny"])
def test_decode_steps_replay_one_graph_on_the_bound_kv_buffers(capturing, name, request):
    path = model_path(name, request)
    sess = onnxep.InferenceSession(path, providers=["fakedev"])
    assert sess.capture_plan().mode == "whole", sess.capture_plan().format()
    want = step_by_step(path, PROMPT, 12)
    first = onnxep.generate(sess, PROMPT, 12, capacity=30, progress=False)
    assert first.tokens == want
    # 11 decode steps of one shape: 2 warm-up runs, a capture, then replays
    c = first.capture_stats
    assert (c["captures"], c["replays"], c["fallbacks"], c["rebinds"]) == (1, 12 - 1 - 3, 0, 0), c
    # the graph reads and writes the bound KV buffers: no cache is copied in or out; the
    # replays copy only the small host feeds (ids, mask, positions) into the graph's buffers
    assert first.copied_outputs == [0] * 12
    states = decode_spec(sess.get_inputs(), sess.get_outputs()).states
    caches = sum(1 for s in states if s.grow_axis is not None)
    host_feeds = len(sess.get_inputs()) - caches
    assert c["copies"] == c["replays"] * host_feeds, (c, host_feeds)
    # a second decoder has KV buffers of its own: the old graph (baked on the first's
    # buffers) is never replayed on them; one new capture at its first decode step
    again = onnxep.generate(sess, PROMPT, 12, capacity=30, progress=False)
    assert again.tokens == want
    c = again.capture_stats
    assert (c["captures"], c["replays"], c["fallbacks"], c["rebinds"]) == (1, 12 - 2, 0, 1), c
    assert again.copied_outputs == [0] * 12 and c["copies"] == c["replays"] * host_feeds


# -- the progress bar ---------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_bar_is_shown_when_asked_or_on_a_terminal_for_long_loops(monkeypatch):
    assert wants_bar(True, 1) and not wants_bar(False, 10_000)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not wants_bar(None, 10_000)
    monkeypatch.setattr(sys, "stderr", _Terminal())
    assert wants_bar(None, 64) and not wants_bar(None, 63)
    assert wants_bar(None, 5, min_total=0)


def test_generate_draws_a_tqdm_bar_on_stderr(capsys):
    pytest.importorskip("tqdm")
    sess = onnxep.InferenceSession(MODELS["qwen2_fp32"], providers=["cpu"])
    onnxep.generate(sess, PROMPT, 3, progress=True)
    assert "generate" in capsys.readouterr().err
    onnxep.generate(sess, PROMPT, 3, progress=False)
    assert capsys.readouterr().err == ""


def test_missing_tqdm_warns_and_shows_nothing(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError
    # the onnxep logger's level is process state other tests may have left raised
    caplog.set_level(logging.WARNING, logger="onnxep")
    bar = progress_bar(10, True, "x")
    bar.update(1)
    bar.close()
    assert "tqdm is not installed" in caplog.text


# -- the device path's pipeline -----------------------------------------------------------


class _Ordered(FakeDevice):
    """A fake device that logs when the host waits for a token's copy."""

    log: list[str] = []

    def to_host_async(self, x):
        snapshot = np.array(x, copy=True)  # what the copy queued now will deliver
        self.counts["device_to_host"] += 1  # counted when queued, as the CUDA provider does

        def wait():
            self.log.append("read")
            return snapshot

        return wait


class _OrderedPlugin(FakePlugin):
    @hookimpl
    def onnxep_create_provider(self, options):
        return _Ordered(options)


@pytest.mark.parametrize("pipeline", [True, False], ids=["pipelined", "one-at-a-time"])
def test_step_t_plus_1_is_queued_before_token_t_is_read(monkeypatch, pipeline):
    plugin = _OrderedPlugin(share=True)
    onnxep.register_provider(plugin, name="fakedev-ordered-plugin")
    try:
        path = MODELS["qwen2_fp32"]
        sess = onnxep.InferenceSession(path, providers=["fakedev"])
        _Ordered.log = []
        run = sess.run_with_iobinding

        def logged(io, run_options=None):
            _Ordered.log.append("run")
            return run(io, run_options)

        monkeypatch.setattr(sess, "run_with_iobinding", logged)
        steps = 5
        dec = GreedyDecoder(sess, PROMPT, steps, pipeline=pipeline)
        while not dec.done:
            dec.step()
        res = dec.finish()
    finally:
        unregister_plugin(plugin)
    assert res.tokens == step_by_step(path, PROMPT, steps)
    if pipeline:  # after the prefill each token is read once the next step is queued behind it
        assert _Ordered.log == ["run"] + ["run", "read"] * (steps - 1) + ["read"], _Ordered.log
    else:  # a benchmark's interleaved steps: each step's run and read alone
        assert _Ordered.log == ["run", "read"] * steps, _Ordered.log
    assert res.device_to_host_reads == [1] * steps


@pytest.mark.parametrize("chooser", ["argmax", "choose"])
def test_device_path_takes_ragged_rows_and_a_chooser(chooser):
    """The pipelined device path reads each row's first token at its own last position and
    asks ``choose`` where one is given, as the host path does: the same tokens as each prompt
    decoded alone on the CPU."""
    plugin = FakePlugin(share=True)
    onnxep.register_provider(plugin, name="fakedev-ragged-plugin")
    try:
        path = str(DATA / "genai" / "qwen2_fp32" / "model.onnx")
        dev = onnxep.InferenceSession(path, providers=["fakedev"])
        cpu = onnxep.InferenceSession(path, providers=["cpu"])
        rng = np.random.default_rng(5)
        prompts = [rng.integers(3, 500, n) for n in (7, 3, 5)]
        batch = np.zeros((3, 7), np.int64)
        for b, p in enumerate(prompts):
            batch[b, : len(p)] = p
        seen = []

        def choose(logits, xp):
            seen.append(logits.shape)
            return xp.argmax(logits, axis=-1)

        pick = None if chooser == "argmax" else choose
        dec = GreedyDecoder(dev, batch, 5, lengths=[7, 3, 5], choose=pick, capacity=16)
        assert dec.state_path == SHARED
        while not dec.done:
            dec.step()
        for row, p in zip(dec.finish().token_ids, prompts):
            assert row.tolist() == onnxep.generate(cpu, p, 5, progress=False).tokens
        if pick is not None:
            assert seen and all(s == (3, 512) for s in seen)
    finally:
        unregister_plugin(plugin)
