"""The CUDA provider without a GPU: availability reasons, options, declines, no CuPy import."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from onnxep.errors import ConfigError
from onnxep.providers import NodeInfo, ValueInfo
from onnxep.providers_cuda import availability
from onnxep.providers_cuda.options import parse_bytes, parse_options, stream_handle
from onnxep.providers_cuda.provider import CUDAProvider


def test_missing_cupy_says_how_to_install(monkeypatch):
    monkeypatch.setattr(availability.importlib.util, "find_spec", lambda name: None)
    why = availability.unavailable_reason()
    assert why.startswith("CuPy is not installed") and "[cuda12]" in why
    assert availability.install_hint() in why


@pytest.mark.parametrize("editable", [True, False])
def test_install_hint_follows_the_install_mode(monkeypatch, editable):
    monkeypatch.setattr(
        availability, "source_checkout", lambda: "/src/onnxep" if editable else None
    )
    hint = availability.install_hint()
    if editable:
        assert 'pip install -e ".[cuda12]" (in the checkout /src/onnxep)' in hint
    else:
        assert hint.startswith('pip install "onnxep[cuda12]"')


def test_missing_driver_is_one_sentence(monkeypatch):
    monkeypatch.setattr(availability.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(availability, "_driver_library", lambda: None)
    assert "no NVIDIA driver found" in availability.unavailable_reason()


def test_old_driver_for_the_installed_cupy(monkeypatch):
    monkeypatch.setattr(availability.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(availability, "driver_status", lambda: (12040, 1))
    monkeypatch.setattr(availability, "cupy_cuda_major", lambda: 13)
    why = availability.unavailable_reason()
    assert "cupy-cuda13x" in why and "CUDA 12.4" in why
    assert availability.install_command("cuda12") in why


def test_no_device(monkeypatch):
    monkeypatch.setattr(availability.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(availability, "driver_status", lambda: (13000, 0))
    assert "no CUDA device" in availability.unavailable_reason()


def test_a_cpu_session_never_imports_cupy(tmp_path):
    """A stand-in cupy package that records its import: a CPU session must not touch it."""
    fake = tmp_path / "cupy"
    fake.mkdir()
    marker = tmp_path / "imported"
    (fake / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    code = textwrap.dedent(
        """
        import sys, numpy as np, onnxep
        from onnx import helper, TensorProto
        g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        s = onnxep.InferenceSession(m, providers=["cpu"])
        s.run(None, {"x": np.ones(2, np.float32)})
        rows = {r.name: r for r in onnxep.get_all_providers()}
        print(rows["cuda"].available, rows["cuda"].reason)
        print("cupy" in sys.modules)
        """
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    available, in_modules = out.stdout.strip().splitlines()[-2:]
    assert in_modules == "False" and not marker.exists()
    assert available.startswith("False")  # no driver here: the reason is the driver's


@pytest.mark.parametrize(
    ("value", "n"), [(1024, 1024), ("2GB", 2 * 10**9), ("512MiB", 512 << 20), ("1.5 kib", 1536)]
)
def test_sizes(value, n):
    assert parse_bytes(value) == n


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"device_id": "x"}, "device_id must be an int"),
        ({"device_id": True}, "non-negative int"),
        ({"gpu_mem_limit": -5}, "positive"),
        ({"gpu_mem_limit": "2 bananas"}, "not a size"),
        ({"devcie_id": 0}, "unknown CUDA provider option"),
        ({"use_tf32": "yes"}, "use_tf32 must be 0 or 1"),
    ],
)
def test_bad_options(options, match):
    with pytest.raises(ConfigError, match=match):
        parse_options(options)


def test_options_defaults_and_onnxruntime_keys():
    o = parse_options({"device_id": "1", "gpu_mem_limit": 0, "arena_extend_strategy": 1})
    assert o.device_id == 1 and o.gpu_mem_limit is None
    assert o.ignored == ("arena_extend_strategy",)
    assert o.use_tf32 is False  # onnxruntime's default is 1: ours keeps float32 exact


@pytest.mark.parametrize(("raw", "on"), [(1, True), ("1", True), (True, True), ("0", False)])
def test_use_tf32_is_honoured_not_ignored(raw, on):
    o = parse_options({"use_tf32": raw})
    assert o.use_tf32 is on and "use_tf32" not in o.ignored


def test_tf32_is_per_run_context():
    from onnxep.providers_cuda.math_mode import allow_tf32, tf32

    assert tf32() is False
    with allow_tf32(True):
        assert tf32() is True
        with allow_tf32(False):
            assert tf32() is False
        assert tf32() is True
    assert tf32() is False


def test_stream_handles():
    class Torchish:
        cuda_stream = 1234

    class Protocol:
        def __cuda_stream__(self):
            return (0, 99)

    assert stream_handle(77) == 77
    assert stream_handle(Torchish()) == 1234 and stream_handle(Protocol()) == 99
    with pytest.raises(ConfigError, match="stream must be"):
        stream_handle("fast")


def _node(op, dtypes, kind="tensor", domain="", **attrs):
    vals = tuple(
        ValueInfo(f"v{i}", kind, None if d is None else np.dtype(d)) for i, d in enumerate(dtypes)
    )
    return NodeInfo(op, domain, f"{op}_0", 17, attrs, vals[:1], vals[1:])


@pytest.mark.parametrize(
    ("node", "match"),
    [
        (_node("Relu", ["float32", "float32"]), None),
        (_node("Cast", ["float32", "bfloat16"]), "bfloat16 is declined for now"),
        (_node("Identity", ["float8_e4m3fn", "float8_e4m3fn"]), "not a CuPy dtype"),
        (_node("Identity", [object, object]), "strings stay on the host"),
        (_node("SequenceAt", ["float32", "float32"]), "sequences stay on the host"),
        (_node("Identity", ["float32", "float32"], kind="sequence"), "sequence values"),
        (_node("RandomNormalLike", ["float32", "float32"]), "random"),
    ],
)
def test_decline_reasons(node, match):
    import ml_dtypes  # noqa: F401 - registers the narrow dtypes with NumPy

    why = CUDAProvider.decline_reason(node)
    if match is None:
        assert why is None
    else:
        assert why is not None and match in why
