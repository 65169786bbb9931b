"""The hybrid (Qwen3.5-style) decode kernels on CUDA against the CPU provider.

LinearAttention (both domains), LinearAttentionGate, CausalConvWithState (both
domains), GatedRMSNorm and LpNormalization: one-node models run with
``providers=[provider]`` and ``disable_fallback=True`` and are compared output
by output with ``providers=["cpu"]`` at the project's per-dtype tolerances
(float32 atol 1e-5 rtol 1e-4, float16 atol 2.5e-3 rtol 1e-3), and the one
expected kernel must have launched exactly once. Every case has an id that
names its shapes, dtypes and attributes, so a failure says which path broke.
tests/test_hybrid_cuda_emulated.py runs the same cases through the CPU
emulator of the kernels. Below the cases: CUDA graph capture of a decode
step, and the tiny Qwen3.5 export decoding greedily on ``["cuda", "cpu"]``.
"""

from __future__ import annotations

import json
import math
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper
from test_cuda_reduce import check_model, count_launches

import onnxep
from onnxep.testing import compare_output

F32, F16 = np.float32, np.float16
MSFT = "com.microsoft"
DATA = Path(__file__).resolve().parent.parent / "data" / "genai"
#: The ops this module covers, as (domain, op) pairs ("" is ONNX's).
HYBRID_OPS = {
    (MSFT, "LinearAttention"),
    ("", "LinearAttention"),
    (MSFT, "LinearAttentionGate"),
    (MSFT, "CausalConvWithState"),
    ("", "CausalConvWithState"),
    (MSFT, "GatedRMSNorm"),
    ("", "LpNormalization"),
}


@pytest.fixture
def launches(monkeypatch):
    return count_launches(monkeypatch)


def _name(dt) -> str:
    return np.dtype(dt).name


def _rng(case_id: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(case_id.encode()))


def one_node_model(op, domain, feeds, input_names, outputs, attrs, opset=17):
    """A model of one ``op`` node; ``input_names`` lists its inputs ("" for an omitted one)."""
    ins = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(feeds[n].dtype),
                                      list(feeds[n].shape))
        for n in input_names if n
    ]  # fmt: skip
    node = helper.make_node(op, list(input_names), list(outputs), domain=domain, **attrs)
    outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs if o]
    graph = helper.make_graph([node], op, ins, outs)
    imports = [helper.make_opsetid("", opset), helper.make_opsetid(MSFT, 1)]
    model = helper.make_model(graph, opset_imports=imports)
    return model, {n: feeds[n] for n in input_names if n}


def check_case(model, feeds, provider, launches, kernel, what, launched=True):
    """``model`` on ``provider`` alone equals the CPU, and ``kernel`` launched once (or, with
    ``launched`` False, no kernel of ours: nothing to compute)."""
    check_model(model, feeds, provider, launches, {kernel} if launched else set(), what)
    if launched:
        assert launches[kernel] == 1, f"{what}: {kernel} launched {launches[kernel]} times"


# ----------------------------------------------------------------------------- LinearAttention

RULES = ("linear", "gated", "delta", "gated_delta")


@dataclass(frozen=True)
class LaCase:
    heads: tuple[int, int, int, int, int]  # (q heads, KV heads, key heads, d_k, d_v)
    t: int
    rule: str = "gated_delta"
    batch: int = 2
    dtype: type = F32
    decay: str = "head"  # "head": (B, T, H_kv); "key": (B, T, H_kv * d_k)
    beta: str = "head"  # "head": (B, T, H_kv); "shared": (B, T, 1)
    past: bool = True
    window: int = 0
    onnx: bool = False  # ONNX's LinearAttention (opset 27) instead of com.microsoft's
    state_dtype: type | None = None  # past_state's dtype when it differs from q's
    scale: float | None = None

    @property
    def id(self) -> str:
        hq, hkv, nk, dk, dv = self.heads
        bits = [
            "onnx" if self.onnx else "msft",
            self.rule,
            _name(self.dtype),
            f"b{self.batch}t{self.t}",
            f"q{hq}kv{hkv}k{nk}",
            f"dk{dk}dv{dv}",
        ]
        if self.rule in ("gated", "gated_delta"):
            bits.append(f"decay-{self.decay}")
        if self.rule in ("delta", "gated_delta"):
            bits.append(f"beta-{self.beta}")
        bits.append("past" if self.past else "nopast")
        if self.state_dtype is not None:
            bits.append(f"state-{_name(self.state_dtype)}")
        if self.window:
            bits.append(f"window{self.window}")
        if self.scale is not None:
            bits.append(f"scale{self.scale}")
        return "-".join(bits)


def la_feeds(case: LaCase) -> dict[str, np.ndarray | None]:
    """Inputs shaped as in Qwen3.5's decoder: unit keys, beta in (0, 1), negative decay."""
    rng = _rng(case.id)
    hq, hkv, nk, dk, dv = case.heads
    b, t = case.batch, case.t
    k = rng.standard_normal((b, t, nk, dk))
    k /= np.maximum(np.linalg.norm(k, axis=-1, keepdims=True), 1e-6)
    feeds: dict[str, np.ndarray | None] = {
        "query": rng.standard_normal((b, t, hq * dk)),
        "key": k.reshape(b, t, nk * dk),
        "value": rng.standard_normal((b, t, hkv * dv)),
        "past_state": None,
        "decay": None,
        "beta": None,
    }
    if case.past:
        shape = (b, hkv, dk, dv)
        feeds["past_state"] = 0.5 * rng.standard_normal(
            (case.window, *shape) if case.window else shape
        )
    if case.rule in ("gated", "gated_delta"):
        width = hkv * dk if case.decay == "key" else hkv
        feeds["decay"] = -rng.uniform(0.01, 1.5, (b, t, width))
    if case.rule in ("delta", "gated_delta"):
        width = hkv if case.beta == "head" else 1
        feeds["beta"] = 1.0 / (1.0 + np.exp(-rng.standard_normal((b, t, width))))
    out = {}
    for name, v in feeds.items():
        dt = case.state_dtype if name == "past_state" and case.state_dtype else case.dtype
        out[name] = None if v is None else v.astype(dt)
    return out


def la_model(case: LaCase):
    feeds = la_feeds(case)
    names = [n if feeds[n] is not None else "" for n in feeds]
    while not names[-1]:
        names.pop()
    attrs = {"q_num_heads": case.heads[0], "kv_num_heads": case.heads[1], "update_rule": case.rule}
    if case.window:
        attrs["state_window"] = case.window
    if case.scale is not None:
        attrs["scale"] = case.scale
    domain, opset = ("", 27) if case.onnx else (MSFT, 17)
    outs = ["output", "present_state"]
    return one_node_model("LinearAttention", domain, feeds, names, outs, attrs, opset)


def _la_cases() -> list[LaCase]:
    qwen = (2, 4, 2, 128, 128)  # Qwen3.5's layout: fewer key/query heads than value heads
    cases = []
    for dt in (F32, F16):
        for rule in RULES:
            cases.append(LaCase((4, 2, 2, 16, 32), 1, rule, dtype=dt, decay="key"))  # decode
            cases.append(LaCase((4, 2, 2, 16, 32), 5, rule, dtype=dt, beta="shared"))  # prefill
        cases += [
            LaCase(qwen, 1, batch=1, dtype=dt),  # a Qwen3.5 decode step
            LaCase(qwen, 9, batch=1, dtype=dt, decay="key"),
            LaCase((2, 2, 2, 32, 20), 70, dtype=dt),  # several staged chunks, a ragged tile
            LaCase((1, 4, 4, 4, 8), 5, dtype=dt, decay="key", beta="shared"),  # inverse GQA
            LaCase((8, 1, 1, 16, 8), 3, dtype=dt),  # one KV head for eight query heads
            LaCase((2, 2, 2, 256, 16), 2, batch=1, dtype=dt),  # 16 lanes per column
            LaCase((2, 2, 2, 8, 8), 4, dtype=dt, past=False),
            LaCase((2, 2, 2, 8, 8), 5, dtype=dt, window=3),
            LaCase((2, 2, 2, 8, 8), 2, dtype=dt, window=4, decay="key"),
            LaCase((2, 2, 2, 8, 8), 1, dtype=dt, window=2),
            LaCase((4, 2, 2, 16, 16), 1, dtype=dt, onnx=True),
            LaCase((4, 2, 2, 16, 16), 6, "delta", dtype=dt, onnx=True, beta="shared"),
            LaCase((2, 2, 2, 16, 16), 4, "gated", dtype=dt, onnx=True, decay="key"),
        ]
    cases += [
        LaCase((4, 2, 2, 16, 16), 3, dtype=F16, state_dtype=F32),  # a float32 state, fp16 q
        LaCase((4, 2, 2, 16, 16), 1, dtype=F16, state_dtype=F32, onnx=True),
        LaCase((4, 2, 2, 16, 16), 2, scale=0.3),
        # no tokens: present is past (windowed: zeros). Not gated: the CPU kernel cannot
        # reshape an empty decay.
        LaCase((2, 2, 2, 8, 8), 0, "delta"),
        LaCase((2, 2, 2, 8, 8), 0, "delta", window=2),
    ]
    return cases


LA_CASES = _la_cases()


def check_linear_attention(case: LaCase, provider: str, launches: Counter) -> None:
    model, feeds = la_model(case)
    check_case(model, feeds, provider, launches, "linear_attention", case.id)


@pytest.mark.parametrize("case", LA_CASES, ids=lambda c: c.id)
def test_linear_attention_matches_cpu(case, launches):
    check_linear_attention(case, "cuda", launches)


# ----------------------------------------------------------------------------- CausalConvWithState


@dataclass(frozen=True)
class ConvCase:
    x: tuple[int, ...]  # the input as fed: (B, C, L), or (B, L, ...) with channels_last
    k: int
    dtype: type = F32
    attrs: tuple[tuple[str, object], ...] = (("activation", "silu"),)
    bias: bool = True
    past: bool = True
    onnx: bool = False
    mixed: bool = False  # float32 weight, bias and state with a float16 input

    @property
    def id(self) -> str:
        bits = ["onnx" if self.onnx else "msft", _name(self.dtype),
                "x" + "x".join(map(str, self.x)), f"k{self.k}"]  # fmt: skip
        bits += [f"{k}={v}" for k, v in self.attrs]
        bits += [n for n, on in (("nobias", not self.bias), ("nopast", not self.past),
                                 ("mixed", self.mixed)) if on]  # fmt: skip
        return "-".join(bits)


def conv_model(case: ConvCase):
    rng = _rng(case.id)
    a = dict(case.attrs)
    cl = bool(a.get("channels_last", 0))
    state_cl = cl if int(a.get("state_channels_last", -1)) < 0 else bool(a["state_channels_last"])
    if cl:
        chan = (a["input_channels"],) if a.get("input_channels") else case.x[2:]
    else:
        chan = (case.x[1],)
    c = math.prod(chan)
    dil = int(a.get("dilation", 1))
    s_len = int(a.get("state_length", 0)) or (case.k - 1) * dil
    window = int(a.get("state_window", 0))
    state = (case.x[0], s_len, *chan) if state_cl else (case.x[0], c, s_len)
    side = F32 if case.mixed else case.dtype
    feeds = {
        "input": rng.standard_normal(case.x).astype(case.dtype),
        "weight": (0.5 * rng.standard_normal((c, 1, case.k))).astype(side),
        "bias": rng.standard_normal(c).astype(side),
        "past_state": rng.standard_normal((window, *state) if window else state).astype(side),
    }
    names = ["input", "weight", "bias" if case.bias else "", "past_state" if case.past else ""]
    while not names[-1]:
        names.pop()
    outs = ["output", "present_state"]
    if a.get("state_update_capacity"):
        outs.append("state_update")
    domain, opset = ("", 27) if case.onnx else (MSFT, 17)
    return one_node_model("CausalConvWithState", domain, feeds, names, outs, a, opset)


def _conv_cases() -> list[ConvCase]:
    cases = []
    none = (("activation", "none"),)
    for dt in (F32, F16):
        cases += [
            ConvCase((2, 6, 1), 4, dt),  # decode, the hybrid decoder's layout
            ConvCase((2, 6, 9), 4, dt),  # prefill
            ConvCase((1, 6, 2), 4, dt, past=False),  # shorter than the state
            ConvCase((2, 5, 7), 3, dt, none, bias=False),
            ConvCase((2, 7, 3, 4), 3, dt, (("channels_last", 1), ("activation", "silu"))),
            ConvCase((2, 5, 6), 3, dt, (("dilation", 2), ("state_length", 6))),
            ConvCase((2, 4, 3), 4, dt, (("state_channels_last", 1),)),
            ConvCase((2, 5, 3), 3, dt, (("state_window", 3), ("channels_last", 0))),
            ConvCase((2, 1, 4), 3, dt, (("state_window", 2), ("channels_last", 1))),
            ConvCase((2, 5, 10), 3, dt, (("channels_last", 1), ("input_channel_offset", 3),
                                         ("input_channels", 4), ("state_update_capacity", 7))),
            ConvCase((2, 6, 1), 4, dt, onnx=True),
            ConvCase((2, 6, 5), 4, dt, none, onnx=True),
            ConvCase((2, 6, 5), 4, dt, onnx=True, past=False),
        ]  # fmt: skip
    cases += [
        ConvCase((2, 6, 3), 4, F16, mixed=True),  # float32 state and weights, float16 input
        ConvCase((2, 6, 3), 4, F16, onnx=True, mixed=True),  # ONNX rounds the state to fp16
        ConvCase((2, 6, 3), 1, F32, none),  # one tap: an empty state
    ]
    return cases


CONV_CASES = _conv_cases()


def check_conv(case: ConvCase, provider: str, launches: Counter) -> None:
    model, feeds = conv_model(case)
    check_case(model, feeds, provider, launches, "causal_conv_state", case.id)


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: c.id)
def test_causal_conv_matches_cpu(case, launches):
    check_conv(case, "cuda", launches)


# ----------------------------------------------------------------------------- the small ops


@dataclass(frozen=True)
class GateCase:
    a: tuple[int, ...]
    dtype: type = F32
    beta: bool = True
    mixed: bool = False  # float32 dt_bias and decay_scale (float16 exports keep them so)

    @property
    def id(self) -> str:
        dims = "x".join(map(str, self.a))
        return f"gate-{_name(self.dtype)}-{dims}-{'beta' if self.beta else 'nobeta'}" + (
            "-mixed" if self.mixed else ""
        )


def gate_model(case: GateCase):
    rng = _rng(case.id)
    h = case.a[-1]
    side = F32 if case.mixed else case.dtype
    feeds = {
        "a": (3 * rng.standard_normal(case.a)).astype(case.dtype),
        "dt_bias": rng.standard_normal(h).astype(side),
        "decay_scale": -np.exp(rng.standard_normal(h)).astype(side),
        "b": (3 * rng.standard_normal(case.a)).astype(case.dtype),
    }
    names = ["a", "dt_bias", "decay_scale", "b" if case.beta else ""]
    outs = ["decay", "beta"] if case.beta else ["decay"]
    return one_node_model("LinearAttentionGate", MSFT, feeds, names[: 4 if case.beta else 3],
                          outs, {})  # fmt: skip


GATE_CASES = [
    GateCase(shape, dt, beta, mixed)
    for dt in (F32, F16)
    for shape, beta, mixed in (((1, 1, 32), True, False), ((2, 9, 16), True, dt == F16),
                               ((3, 5, 4), False, False))
]  # fmt: skip


@dataclass(frozen=True)
class GatedNormCase:
    x: tuple[int, ...]
    c: int  # len(scale): the group normalised together
    dtype: type = F32
    activation: str = "silu"
    mixed: bool = False  # a float32 scale with float16 X and gate

    @property
    def id(self) -> str:
        dims = "x".join(map(str, self.x))
        return f"gatednorm-{_name(self.dtype)}-{dims}-c{self.c}-{self.activation}" + (
            "-mixed" if self.mixed else ""
        )


def gated_norm_model(case: GatedNormCase):
    rng = _rng(case.id)
    feeds = {
        "X": (2 * rng.standard_normal(case.x)).astype(case.dtype),
        "scale": rng.standard_normal(case.c).astype(F32 if case.mixed else case.dtype),
        "gate": (3 * rng.standard_normal(case.x)).astype(case.dtype),
    }
    attrs = {"epsilon": 1e-6, "activation": case.activation}
    return one_node_model("GatedRMSNorm", MSFT, feeds, ["X", "scale", "gate"], ["Y"], attrs)


GATED_NORM_CASES = [
    c
    for dt in (F32, F16)
    for c in (
        GatedNormCase((1, 1, 4 * 128), 128, dt),  # a decode step's packed heads: warp rows
        GatedNormCase((2, 3, 16), 8, dt, "sigmoid"),
        GatedNormCase((2, 2, 1000), 1000, dt, "swish", mixed=dt == F16),  # block rows
    )
]


@dataclass(frozen=True)
class LpCase:
    shape: tuple[int, ...]
    axis: int = -1
    p: int = 2
    dtype: type = F32
    zero_row: bool = False

    @property
    def id(self) -> str:
        dims = "x".join(map(str, self.shape))
        return f"lp{self.p}-{_name(self.dtype)}-{dims}-axis{self.axis}" + (
            "-zero" if self.zero_row else ""
        )


def lp_model(case: LpCase):
    rng = _rng(case.id)
    x = rng.standard_normal(case.shape).astype(case.dtype)
    if case.zero_row:
        np.moveaxis(x, case.axis, -1)[(0,) * (x.ndim - 1)] = 0  # one all-zero vector
    attrs = {"axis": case.axis, "p": case.p}
    return one_node_model("LpNormalization", "", {"x": x}, ["x"], ["y"], attrs, 22)


LP_CASES = [
    c
    for dt in (F32, F16)
    for c in (
        LpCase((1, 1, 16, 128), dtype=dt, zero_row=True),  # per-head q/k norm of a decode step
        LpCase((2, 3, 5), p=1, dtype=dt),
        LpCase((3, 3000), dtype=dt),  # block rows
        LpCase((2, 7, 33), axis=1, dtype=dt, zero_row=True),  # columns
        LpCase((4, 6), axis=0, p=1, dtype=dt),
    )
]


def check_gate(case: GateCase, provider: str, launches: Counter) -> None:
    model, feeds = gate_model(case)
    check_case(model, feeds, provider, launches, "la_gate", case.id)


def check_gated_norm(case: GatedNormCase, provider: str, launches: Counter) -> None:
    model, feeds = gated_norm_model(case)
    check_case(model, feeds, provider, launches, "gated_rms_norm", case.id)


def check_lp(case: LpCase, provider: str, launches: Counter) -> None:
    model, feeds = lp_model(case)
    check_case(model, feeds, provider, launches, "lp_normalize", case.id)


@pytest.mark.parametrize("case", GATE_CASES, ids=lambda c: c.id)
def test_gate_matches_cpu(case, launches):
    check_gate(case, "cuda", launches)


@pytest.mark.parametrize("case", GATED_NORM_CASES, ids=lambda c: c.id)
def test_gated_norm_matches_cpu(case, launches):
    check_gated_norm(case, "cuda", launches)


@pytest.mark.parametrize("case", LP_CASES, ids=lambda c: c.id)
def test_lp_normalization_matches_cpu(case, launches):
    check_lp(case, "cuda", launches)


def test_lp_normalization_float64_runs_the_generic_kernel(launches):
    model, feeds = lp_model(LpCase((2, 3, 5), dtype=np.float64))
    check_model(model, feeds, "cuda", launches, set(), "lp float64")


# ----------------------------------------------------------------------------- CUDA graphs


def _node(op, domain, opset, attrs, feeds, outputs):
    from onnxep.providers.node import NodeInfo, ValueInfo

    ins = tuple(
        None if v is None else ValueInfo(k, "tensor", v.dtype, v.shape) for k, v in feeds.items()
    )
    outs = tuple(ValueInfo(o, "tensor") for o in outputs)
    return NodeInfo(op, domain, op, opset, attrs, ins, outs)


@pytest.mark.parametrize("which", ["linear_attention", "causal_conv"])
def test_decode_step_captures_and_replays_with_new_inputs(which):
    """Nothing reads device memory on the host or synchronizes: a CUDA graph records a decode
    step, and replaying it after new values are written into the same input buffers gives
    the CPU kernel's answer for those values."""
    import cupy

    if which == "linear_attention":
        from onnxep.providers.ops import op_linear_attention as cpu
        from onnxep.providers_cuda.ops import op_linear_attention as gpu

        first = la_feeds(LaCase((2, 4, 2, 128, 128), 1, batch=1, dtype=F16))
        attrs = {"q_num_heads": 2, "kv_num_heads": 4, "update_rule": "gated_delta"}
        build, ref, varied = gpu.linear_attention, cpu.linear_attention, ("query", "value")
    else:
        from onnxep.providers.ops import op_causal_conv_with_state as cpu
        from onnxep.providers_cuda.ops import op_causal_conv_with_state as gpu

        _, first = conv_model(ConvCase((1, 64, 1), 4, F16))
        attrs = {"activation": "silu"}
        build, ref, varied = gpu.causal_conv_with_state, cpu.causal_conv_with_state, ("input",)
    varied += ("past_state",)
    op = "LinearAttention" if which == "linear_attention" else "CausalConvWithState"
    outputs = ("output", "present_state")
    node = _node(op, MSFT, 1, attrs, first, outputs)
    pool = cupy.cuda.MemoryPool()  # the graph's temporaries stay out of other allocations
    stream = cupy.cuda.Stream(non_blocking=True)
    with cupy.cuda.using_allocator(pool.malloc), stream:
        run = build(node, cupy)
        dev = {k: None if v is None else cupy.asarray(v) for k, v in first.items()}
        run(*dev.values())  # warm-up: launch plans built, pool blocks cached
        stream.synchronize()
        stream.begin_capture()
        outs = run(*dev.values())
        graph = stream.end_capture()
    rng = np.random.default_rng(11)
    for step in range(2):
        host = dict(first)
        for k in varied:  # new values of the same shapes, written into the captured buffers
            host[k] = (first[k] * rng.uniform(0.5, 1.5, first[k].shape)).astype(first[k].dtype)
            dev[k].set(host[k], stream=stream)
        graph.launch(stream)
        stream.synchronize()
        want = ref(node, np)(*host.values())
        for name, g, w in zip(outputs, outs, want, strict=True):
            res = compare_output(f"{which} replay {step} {name}", cupy.asnumpy(g), w, "cuda", "cpu")
            assert all(r.ok for r in res), [r.describe() for r in res]


# ----------------------------------------------------------------------------- the Qwen3.5 export


def greedy(sess, prompt, steps, check_against=None, tol=(1e-4, 1e-3)):
    """Greedy tokens of ``sess`` (as tests/test_genai_models.py decodes). With
    ``check_against``, each step's feeds also run on that session and every output of the
    step (logits, conv and recurrent states, KV cache) must match it within ``tol`` (atol,
    rtol), so a wrong kernel is named by the first output it spoils."""
    from onnxep.generation.spec import DecodeState, decode_spec, model_dims

    spec = decode_spec(sess.get_inputs(), sess.get_outputs())
    names = [o.name for o in sess.get_outputs()]
    dims = model_dims(sess.model_path)
    state = DecodeState(spec, len(prompt), prompt=np.array(prompt), dims=dims)
    for step in range(steps):
        feeds = state.feeds()
        got = sess.run(None, feeds)
        if check_against is not None:
            want = check_against.run(None, feeds)
            for name, g, w in zip(names, got, want, strict=True):
                g64, w64 = np.asarray(g, np.float64), np.asarray(w, np.float64)
                excess = np.abs(g64 - w64) - (tol[0] + tol[1] * np.abs(w64))
                worst = np.abs(g64 - w64).max() if g.size and g.shape == w.shape else None
                assert g.shape == w.shape and not np.any(excess > 0), (
                    f"step {step}: {name} {g.shape} differs from the CPU's {w.shape} "
                    f"(largest difference {worst})"
                )
        state.advance(dict(zip(names, got)))
    return state.tokens


#: Fused ops that stand in for hybrid ops (the fusion passes fold these into them).
FUSED_HYBRID = {("onnxep", "GatedLinearAttention"): {"LinearAttention", "LinearAttentionGate",
                                                     "LpNormalization"}}  # fmt: skip


def hybrid_placement_problems(sess, provider):
    """Each hybrid op of ``sess`` (or fused op standing in for some) that is not on
    ``provider`` (every one must be there)."""
    ops = HYBRID_OPS | set(FUSED_HYBRID)
    placed = [n for n in sess.placement() if (n.domain.replace("ai.onnx", ""), n.op_type) in ops]
    covered = {op for n in placed for op in FUSED_HYBRID.get((n.domain, n.op_type), ())}
    missing = {op for _, op in HYBRID_OPS} - {n.op_type for n in placed} - covered
    off = [f"{n.node} ({n.op_type}): {n.declined}" for n in placed if n.provider != provider]
    return [f"no {op} node in the model" for op in sorted(missing)] + off


def build_fp16_hybrid(tmp_path):
    """The factory's tiny Qwen3.5-style decoder in float16 (float16 states, float32 gate
    parameters, as onnxruntime-genai's builder exports it)."""
    import sys

    root = str(Path(__file__).resolve().parents[2])
    if root not in sys.path:
        sys.path.insert(0, root)  # bench/ is imported from the repo root, not installed
    from bench.factory import build_hybrid_decoder

    path = tmp_path / "hybrid_fp16" / "model.onnx"
    path.parent.mkdir()
    build_hybrid_decoder("tiny", dtype="fp16", seed=3, out_path=path)
    return str(path)


def test_qwen3_5_export_decodes_the_cpu_tokens_on_cuda():
    ref = json.loads((DATA / "qwen3_5_tokens.json").read_text())
    path = str(DATA / "qwen3_5_fp32" / "model.onnx")
    gpu = onnxep.InferenceSession(path, providers=["cuda", "cpu"])
    cpu = onnxep.InferenceSession(path, providers=["cpu"])
    problems = hybrid_placement_problems(gpu, "cuda")
    assert not problems, "; ".join(problems)
    got = greedy(gpu, ref["prompt"], 8, check_against=cpu)
    assert got == greedy(cpu, ref["prompt"], 8)


def test_fp16_hybrid_decoder_steps_match_the_cpu_on_cuda(tmp_path):
    """Every output of a prefill and three decode steps, each from the CPU's feeds. The
    tolerance is loose: cuBLAS and NumPy round the float16 projections differently, and
    the differences pass through four layers; a wrong state shows as far larger."""
    path = build_fp16_hybrid(tmp_path)
    gpu = onnxep.InferenceSession(path, providers=["cuda", "cpu"])
    cpu = onnxep.InferenceSession(path, providers=["cpu"])
    problems = hybrid_placement_problems(gpu, "cuda")
    assert not problems, "; ".join(problems)
    prompt = list(np.random.default_rng(5).integers(0, 512, 7))
    greedy(gpu, prompt, 4, check_against=cpu, tol=(3e-2, 3e-2))
