"""The CUDA LSTM / GRU / RNN recurrence kernel on the CPU, through the kernel emulator.

The CUDA C of ``providers_cuda/ops/recurrence_cuda.py`` is compiled with g++
(tests/cuda_emulator.py, one fiber per CUDA thread, a missing barrier shows in one of the
two thread orders) and run by the op modules' own builders in a session of a provider
that runs them on NumPy arrays with the CUDA provider's error flag; only the input
projection (one cuBLAS GEMM on the GPU) is NumPy's product here. Cases: ONNX's node suite
for the three ops against its recorded outputs, and our own (tests/cuda/rnn_cases.py)
against the CPU provider and onnxruntime (which has no layout 1: it runs the layout-0 twin
of those). A bad ``sequence_lens`` is reported through the error flag; what the kernel does
not take runs the generic kernel with the reason as the step's capture note.
"""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
from collections import Counter

import cuda_emulator as emu
import numpy as np
import onnxruntime as ort
import pytest
from emulated_provider import registered
from test_cuda_index_emulated import HOST_PRIMITIVES, EmulatedDevice

import onnxep
from onnxep.errors import BoundsError
from onnxep.providers.kernel import CAPTURE_ATTR
from onnxep.providers.node import NodeInfo, ValueInfo
from onnxep.providers_cuda import error_flag
from onnxep.providers_cuda.ops import index_cuda, recurrence_cuda

cases = emu.gpu_test_module("rnn_cases")

NAME = "rnnemu"
OWN = {c.id: c for c in cases.OWN}
NODE_SUITE = cases.node_suite_cases()


class _Device(EmulatedDevice):
    """The index kernels' emulated device; a null pointer (0 on the GPU) goes in as None."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()

    def kernels(self, body, names, signature):
        compiled = emu.compile_kernels(HOST_PRIMITIVES + body, names)

        def launcher(name):
            k = compiled[name]

            def launch(grid, block, args, stream):
                conv = []
                for c, a in zip(signature, args, strict=True):
                    if c == "p":
                        conv.append(None if isinstance(a, int) and a == 0 else a)
                    else:
                        conv.append(np.int64(a) if c == "q" else a)
                self.counts[name.split("<")[0]] += 1
                k((grid,), (block,), tuple(conv))

            return launch

        return {n: launcher(n) for n in names}


@pytest.fixture(scope="module")
def provider():
    why = emu.why_unavailable()
    if why:
        pytest.skip(why)
    with registered(NAME, ("op_lstm", "op_gru", "op_rnn")) as name:
        yield name


@pytest.fixture
def device(provider, monkeypatch):
    dev = _Device()
    monkeypatch.setattr(index_cuda, "device_for", lambda xp: dev if xp is np else None)
    # the one cuBLAS GEMM of a run, as NumPy's product (in float32, as cuBLAS computes it)
    monkeypatch.setattr(recurrence_cuda, "project", lambda x2, w2: x2 @ w2.T)
    return dev


def _session(model):
    opts = onnxep.SessionOptions(disable_fallback=True)
    return onnxep.InferenceSession(model.SerializeToString(), opts, [NAME])


def _ort_reference(case):
    """onnxruntime's outputs for ``case``; for layout 1 (which it lacks), its layout-0 twin's
    over the transposed inputs, transposed back."""
    if not case.layout:
        m = cases.case_model(case)
        return ort.InferenceSession(m.SerializeToString()).run(None, cases.case_feeds(case))
    attrs = {k: v for k, v in case.attrs.items() if k != "layout"}
    twin = type(case)(**{**case.__dict__, "attrs": attrs})
    feeds = cases.case_feeds(case)
    f0 = {
        k: v.transpose(1, 0, 2) if k in ("X", "initial_h", "initial_c") else v
        for k, v in feeds.items()
    }
    m = cases.case_model(twin)
    y, *states = ort.InferenceSession(m.SerializeToString()).run(None, f0)
    return [y.transpose(2, 0, 1, 3), *(s.transpose(1, 0, 2) for s in states)]


@pytest.mark.parametrize("cid", sorted(OWN))
def test_own_cases_match_cpu_and_onnxruntime(cid, device):
    case = OWN[cid]
    model = cases.case_model(case)
    feeds = cases.case_feeds(case)
    got = _session(model).run(None, feeds)
    cpu = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"]).run(None, feeds)
    ref = _ort_reference(case)
    tol = cases.tolerance(case.dtype)
    for g, c, r in zip(got, cpu, ref, strict=True):
        assert g.dtype == np.dtype(case.dtype) and g.shape == c.shape
        np.testing.assert_allclose(g.astype(np.float32), c.astype(np.float32), **tol)
        np.testing.assert_allclose(g.astype(np.float32), r.astype(np.float32), **tol)
    assert device.counts == {"rnn_seq": 1}, device.counts


@pytest.mark.parametrize("name", sorted(NODE_SUITE))
def test_onnx_node_cases_match_their_recorded_outputs(name, device):
    from onnxep.testing import compare_output
    from onnxep.tools.conformance import case_data, case_model

    model = case_model(NODE_SUITE[name])
    ins, outs = case_data(NODE_SUITE[name])[0]
    sess = _session(model)
    got = sess.run(None, dict(zip([i.name for i in model.graph.input], ins)))
    bad = []
    for arg, g, w in zip(sess.get_outputs(), got, outs, strict=True):
        bad += [r.describe() for r in compare_output(arg.name, g, w, NAME, "onnx") if not r.ok]
    assert not bad, "\n".join(bad)
    assert device.counts == {"rnn_seq": 1}, device.counts


@pytest.mark.parametrize(
    "cid", ["gru-lbr-ragged-clip", "gru-activations", "lstm-hidden-45", "rnn-one-step"]
)
def test_barriers_hold_in_either_thread_order(cid, device, fiber_order):
    """h_{t-1} is double-buffered behind one barrier a step (GRU's r * h behind a second):
    a missing one shows as a wrong result in one of the orders."""
    case = OWN[cid]
    model = cases.case_model(case)
    feeds = cases.case_feeds(case)
    got = _session(model).run(None, feeds)
    want = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"]).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, **cases.tolerance(case.dtype))


@pytest.mark.parametrize("op", ["GRU", "LSTM"])
def test_the_largest_hidden_size_a_block_takes(op, device):
    """hidden 1024: a full 1024-thread block and the shared state at its capacity."""
    case = cases.RnnCase(
        f"{op}-1024",
        op,
        steps=2,
        batch=2,
        inputs=3,
        hidden=1024,
        attrs={"direction": "reverse"},
        lens=(2, 1),
        init_h=True,
    )
    model = cases.case_model(case)
    feeds = cases.case_feeds(case)
    got = _session(model).run(None, feeds)
    want = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"]).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert device.counts == {"rnn_seq": 1}, device.counts


@pytest.mark.parametrize("case", cases.BAD_LENS, ids=lambda c: c.id)
def test_a_bad_sequence_length_is_reported_and_the_session_stays_usable(case, device):
    model = cases.case_model(case)
    feeds = cases.case_feeds(case)
    sess = _session(model)
    row = int(np.flatnonzero((feeds["sequence_lens"] < 0) | (feeds["sequence_lens"] > 5))[0])
    value = int(feeds["sequence_lens"][row])
    want = (
        rf"{case.op} node '\w+': sequence_lens values must be in \[0, 5\] \(the sequence length "
        rf"of X\), got sequence_lens\[{row}\] = {value}"
    )
    with pytest.raises(BoundsError, match=want) as got_err:
        sess.run(None, feeds)
    # the CPU provider refuses it with the same error, and onnxruntime refuses it too
    cpu = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    with pytest.raises(BoundsError, match=want) as cpu_err:
        cpu.run(None, feeds)
    assert str(got_err.value) == str(cpu_err.value)
    with pytest.raises(Exception, match="sequence_lens"):
        ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    good = {**feeds, "sequence_lens": np.clip(feeds["sequence_lens"], 0, 5)}
    got = sess.run(None, good)
    want_out = cpu.run(None, good)
    for g, w in zip(got, want_out, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert sess.providers[0].error_flag.raised == 1


def _node(op, dtype=np.float32, hidden=8, r_shape=None, **attrs):
    r_shape = r_shape or (1, cases.GATES[op] * hidden, hidden)
    vi = [
        ValueInfo("X", "tensor", np.dtype(dtype), (5, 3, 4)),
        ValueInfo("W", "tensor", np.dtype(dtype), None),
        ValueInfo("R", "tensor", np.dtype(dtype), r_shape),
    ]
    return NodeInfo(
        op, name="n", opset=22, attrs={"hidden_size": hidden, **attrs}, inputs=tuple(vi)
    )


def _builder(op):
    mod = importlib.import_module(f"onnxep.providers_cuda.ops.op_{op.lower()}")
    return getattr(mod, op.lower())


@pytest.mark.parametrize(
    ("op", "kw", "reason"),
    [
        ("LSTM", {"hidden": 1025}, "hidden_size 1025 is past the 1024 units one block"),
        ("GRU", {"dtype": np.float64}, "dtype float64 (the recurrence kernel takes float32"),
        ("RNN", {"hidden": 2048}, "hidden_size 2048 is past the 1024 units"),
    ],
)
def test_what_the_kernel_does_not_take_runs_the_generic_kernel_with_a_note(op, kw, reason, device):
    flag = error_flag.ErrorFlag.on_host()
    with error_flag.building(flag):
        run = _builder(op)(_node(op, **kw), np)
    note = getattr(run, CAPTURE_ATTR, "")
    assert reason in note and "refuse inside stream capture" in note, note
    assert not isinstance(run, recurrence_cuda.Recurrence)


def test_the_hidden_size_known_only_at_run_time_falls_back_per_call(device):
    """R's shape unknown when built: a hidden size past a block is counted at run time."""
    flag = error_flag.ErrorFlag.on_host()
    node = NodeInfo("RNN", name="n", opset=22, attrs={}, inputs=())
    with error_flag.building(flag):
        run = _builder("RNN")(node, np)
    assert isinstance(run, recurrence_cuda.Recurrence)
    rng = np.random.default_rng(0)
    h = 1030
    x = rng.standard_normal((2, 1, 3)).astype(np.float32)
    w = rng.standard_normal((1, h, 3)).astype(np.float32) * 0.1
    r = rng.standard_normal((1, h, h)).astype(np.float32) * 0.01
    y, yh = run(x, w, r)
    assert y.shape == (2, 1, 1, h) and not device.counts
    (why,) = run.fallbacks
    assert why.startswith("RNN: hidden_size 1030 is past the 1024 units one block"), why


def test_built_outside_a_provider_the_generic_kernel_runs(device):
    run = _builder("LSTM")(_node("LSTM"), np)
    assert not isinstance(run, recurrence_cuda.Recurrence)


@pytest.mark.parametrize("batch", [1, 3])
def test_a_conv1d_lstm_voice_activity_model_matches_onnxruntime(batch, device):
    """The VAD model's LSTM on the emulated kernel, its convolutions on the CPU."""
    model = cases.voice_activity_model()
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=[NAME, "cpu"])
    (lstm,) = [p for p in sess.placement() if p.op_type == "LSTM"]
    assert lstm.provider == NAME, lstm
    ref = ort.InferenceSession(model.SerializeToString())
    audio = np.random.default_rng(batch).uniform(-1, 1, (batch, 1, 1600)).astype(np.float32)
    (got,) = sess.run(None, {"audio": audio})
    (want,) = ref.run(None, {"audio": audio})
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert device.counts == {"rnn_seq": 1}, device.counts


def test_the_cuda_library_runs_the_three_ops_on_its_own_capture_safe_kernels():
    from onnxep.providers_cuda.declines import CUPY_BLAS_OPS
    from onnxep.providers_cuda.library import cuda_library

    for op in ("LSTM", "GRU", "RNN"):
        specs = [s for s in cuda_library() if (s.domain, s.op_type) == ("", op)]
        assert specs and all(s.capture_safe for s in specs), specs
        assert {s.builder.__module__ for s in specs} == {
            f"onnxep.providers_cuda.ops.op_{op.lower()}"
        }
        assert ("", op) not in CUPY_BLAS_OPS


@pytest.mark.slow  # nvcc takes about 10 s for the six instantiations
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
def test_cuda_source_compiles_with_nvcc_without_spills(tmp_path):
    """The emulator compiles the kernel with g++; nvcc checks the CUDA itself for sm_90, every
    instantiation, with NVRTC's launch bounds (1024 threads: at most 64 registers each)."""
    refs = "".join(f"  p[{i}] = (void*)&{n};\n" for i, n in enumerate(recurrence_cuda.NAMES))
    body = recurrence_cuda.BODY.replace("#ifdef __CUDACC_RTC__", "#if 1")  # nvcc is not NVRTC
    cu = tmp_path / "rnn.cu"
    cu.write_text(
        f"{index_cuda.PRIMITIVES}{body}\n__global__ void take_all(void** p) {{\n{refs}}}\n"
    )
    cmd = [
        "nvcc",
        "-std=c++17",
        "-arch=sm_90",
        "-cubin",
        "-Xptxas",
        "-v",
        "-o",
        str(tmp_path / "rnn.cubin"),
        str(cu),
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    built = re.findall(r"Compiling entry function '(\w+)'", res.stderr)
    assert len(built) == len(recurrence_cuda.NAMES) + 1, res.stderr[-4000:]
    spills = re.findall(r"(\d+) bytes spill stores", res.stderr)
    assert spills and not any(int(b) for b in spills), "a kernel spills registers"
    regs = [int(r) for r in re.findall(r"Used (\d+) registers", res.stderr)]
    assert max(regs) <= 64, regs
