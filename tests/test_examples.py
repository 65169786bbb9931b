"""The example plugin packages: built, pip-installed, discovered, and correct.

``examples/onnxep-torch`` is a real third-party provider (PyTorch tensors)
and ``examples/onnxep-swish`` a custom-op plugin for the CPU provider. Both
are built into wheels and installed into a fresh virtual environment next to
onnxep's own wheel, as a user would; the torch provider's node-suite run
happens in this environment, with the example pip-installed into a folder
put on ``sys.path``.
"""

from __future__ import annotations

import shutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper

import onnxep
from onnxep.conformance import exclusions
from onnxep.testing import assert_parity, backend_suite

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {"onnxep-torch": "onnxep_torch", "onnxep-swish": "onnxep_swish"}

pytest.importorskip("torch", reason="the torch example needs torch (pip install torch==2.13.0)")
pytest.importorskip("array_api_compat", reason="the torch example needs array-api-compat")

#: Node cases left out of the torch run, with why: the CPU reference's own
#: exclusions, and one case no provider passes (fp16 rounding between the
#: steps of the expanded function differs from the recorded float32 result).
TORCH_EXCLUDED = {
    **exclusions().get("node", {}),
    r"^test_attention_4d_causal_fp16_expanded$": "the CPU reference fails it too (fp16 rounding)",
}


def _pip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pip", *args], check=True, capture_output=True, text=True
    )


def _copy_example(name: str, dest: Path) -> Path:
    """A clean copy, so building leaves no build/ or egg-info in the source tree."""
    out = dest / name
    shutil.copytree(
        ROOT / "examples" / name,
        out,
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
    )
    return out


def _install_target(target: Path, tmp: Path) -> None:
    """pip-install both examples (no deps, no isolation) into ``target``."""
    for name in EXAMPLES:
        src = _copy_example(name, tmp)
        _pip(
            "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target), str(src)
        )


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """Both examples pip-installed into a folder on ``sys.path``; providers rediscovered."""
    tmp = tmp_path_factory.mktemp("examples")
    target = tmp / "site"
    _install_target(target, tmp / "src")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(target))
        onnxep.rediscover()
        yield target
        for mod in [m for m in sys.modules if m.split(".")[0] in EXAMPLES.values()]:
            sys.modules.pop(mod, None)
    onnxep.rediscover()


# -- discovery -------------------------------------------------------------------


def test_examples_are_discovered_through_entry_points(installed):
    statuses = {s.name: s for s in onnxep.get_all_providers()}
    assert statuses["torch"].available
    assert statuses["torch"].source == "onnxep_torch.plugin:plugin"
    assert "TorchExecutionProvider" in statuses["torch"].aliases
    # the swish plugin offers no provider, and loads without failure
    assert "swish" not in statuses
    assert not [f for f in onnxep.plugin_failures() if f.name in ("torch", "swish")]
    # installed and unlisted in plugins.toml: preferred over cpu
    avail = onnxep.get_available_providers()
    assert avail.index("torch") < avail.index("cpu")


def test_cli_lists_the_torch_provider(installed, capsys):
    from onnxep.cli import main

    assert main(["providers"]) == 0
    out = capsys.readouterr().out
    assert "torch" in out and "onnxep_torch.plugin:plugin" in out
    assert "plugins that failed" not in out


# -- the torch provider ------------------------------------------------------------


def _mixed_model():
    """MatMul (torch-native) -> MeanVarianceNormalization (not claimed by torch) -> Relu."""
    return make_model(
        [
            helper.make_node("MatMul", ["x", "w"], ["h"], name="matmul"),
            helper.make_node("MeanVarianceNormalization", ["h"], ["n"], name="mvn", axes=[1]),
            helper.make_node("Relu", ["n"], ["y"], name="relu"),
            helper.make_node("ArgMax", ["h"], ["idx"], name="argmax", axis=1),
        ],
        [tensor("x", ["N", 8])],
        [tensor("y", ["N", 6]), tensor("idx", ["N", 1], TensorProto.INT64)],
        inits=[
            onnx.numpy_helper.from_array(
                np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32), "w"
            ),
        ],
    )


def test_mixed_model_runs_across_torch_and_cpu_with_copies(installed):
    sess = onnxep.InferenceSession(_mixed_model(), providers=["torch"])
    assert sess.get_providers() == ["torch", "cpu"]
    rep = sess.placement()
    assert rep["matmul"].provider == "torch"
    assert rep["relu"].provider == "torch"
    assert rep["argmax"].provider == "torch"
    assert rep["mvn"].provider == "cpu"
    (reason,) = [r for p, r in rep["mvn"].declined if p == "torch"]
    assert "MeanVarianceNormalization" in reason and "not verified on torch" in reason
    hops = {(c.value, c.src, c.dst) for c in rep.copies}
    assert ("h", "torch:cpu", "cpu") in hops  # torch -> host for MVN
    assert ("n", "cpu", "torch:cpu") in hops  # host -> torch for Relu
    report = assert_parity(_mixed_model(), ["torch"], dims={"N": 4})
    assert report.ok and {r.output for r in report.results} == {"y", "idx"}


def test_torch_outputs_are_numpy_and_inputs_may_be_numpy(installed):
    sess = onnxep.InferenceSession(_mixed_model(), providers=["TorchExecutionProvider"])
    y, idx = sess.run(None, {"x": np.ones((2, 8), np.float32)})
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == (2, 6)
    assert idx.dtype == np.int64


def test_torch_declines_dtypes_torch_lacks_with_a_reason(installed):
    model = make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [tensor("x", [2], TensorProto.BFLOAT16)],
        [tensor("y", [2], TensorProto.BFLOAT16)],
    )
    rep = onnxep.InferenceSession(model, providers=["torch"]).placement()
    assert rep["relu"].provider == "cpu"
    assert rep["relu"].declined[0] == ("torch", "Relu: bfloat16 input 0 is not supported on torch")


def test_torch_options_reach_the_provider(installed):
    sess = onnxep.InferenceSession(
        _mixed_model(), providers=[("torch", {"device": "cpu", "unverified": True})]
    )
    assert sess.get_provider_options()["torch"] == {"device": "cpu", "unverified": True}
    # with unverified generic kernels claimed, MVN's generic kernel is tried on torch
    assert "not verified" not in str(sess.placement()["mvn"].declined)


def test_torch_device_that_is_missing_is_one_clear_sentence(installed):
    import torch

    from onnxep.errors import ProviderError

    if torch.cuda.is_available():
        pytest.skip("this torch sees a CUDA device")
    strict = onnxep.SessionOptions(disable_fallback=True)
    with pytest.raises(
        ProviderError, match="'torch' failed to start:.*torch device 'cuda' is not available"
    ):
        onnxep.InferenceSession(_mixed_model(), strict, providers=[("torch", {"device": "cuda"})])
    with pytest.warns(UserWarning, match="'torch' is skipped: failed to start:.*'cuda'"):
        sess = onnxep.InferenceSession(_mixed_model(), providers=[("torch", {"device": "cuda"})])
    assert sess.get_providers() == ["cpu"]


def test_torch_native_kernels_replace_the_generic_ones(installed):
    sess = onnxep.InferenceSession(_mixed_model(), providers=["torch"])
    torch_p = sess.providers[0]
    spec = torch_p.registry.lookup("", "MatMul", 17)
    assert spec.builder.__module__ == "onnxep_torch.ops.op_linalg"
    assert not torch_p.registry.conflicts


_SAMPLE = backend_suite(["torch"], sample=120, exclude=TORCH_EXCLUDED)


@pytest.mark.parametrize("case", _SAMPLE.names)
def test_torch_node_suite_sample(installed, case):
    """A cross-section of the node suite: cases torch declines are skipped with the reason."""
    _SAMPLE.check(case)


def test_torch_passes_every_node_case_it_claims(installed):
    """The whole node suite: every case torch takes whole passes, and it takes >= 1200."""
    outcomes = backend_suite(["torch"], exclude=TORCH_EXCLUDED).run_all()
    failed = [f"{o.name}: {o.reason}" for o in outcomes if o.status == "failed"]
    assert not failed, "\n".join(failed[:20])
    passed = sum(o.status == "passed" for o in outcomes)
    assert passed >= 1200, f"torch ran only {passed} of {len(outcomes)} node cases whole"
    skipped = [o for o in outcomes if o.status == "skipped"]
    assert all(o.reason for o in skipped)


# -- the Swish custom-op plugin ------------------------------------------------------


def _swish_model(beta: float = 1.5):
    return make_model(
        [helper.make_node("Swish", ["x"], ["y"], name="swish", domain="com.example", beta=beta)],
        [tensor("x", ["N", 5])],
        [tensor("y", ["N", 5])],
        extra_opsets=[("com.example", 1)],
    )


def test_swish_plugin_adds_a_custom_op_to_cpu(installed):
    sess = onnxep.InferenceSession(_swish_model(), providers=["cpu"])
    assert sess.placement()["swish"].provider == "cpu"
    x = np.linspace(-4, 4, 10, dtype=np.float32).reshape(2, 5)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, x / (1 + np.exp(-1.5 * x)), rtol=1e-6)


def test_swish_is_cpu_only_and_others_decline_it(installed):
    rep = onnxep.InferenceSession(_swish_model(), providers=["torch"]).placement()
    assert rep["swish"].provider == "cpu"
    assert "no kernel for com.example::Swish" in rep["swish"].declined[0][1]


# -- broken plugins are reported by name; the rest keep working ----------------------

BAD_IMPORT = 'raise ImportError("onnxep_badimport needs libbar, which is missing")\n'

BAD_HOOK = """
from onnxep.providers import hookimpl

class Plugin:
    @hookimpl
    def onnxep_kernels(self, provider):
        raise RuntimeError("kernel table corrupted")

plugin = Plugin()
"""

CONFLICT = """
from onnxep.providers import hookimpl, kernel

@kernel("Relu", since=14)
def relu(node, xp):
    return lambda x: (x * 0,)  # wrong on purpose: it must never be used

class Plugin:
    @hookimpl
    def onnxep_kernels(self, provider):
        return relu.__onnxep_kernels__ if provider.name == "cpu" else None

plugin = Plugin()
"""


@pytest.fixture
def broken_plugins(tmp_path, monkeypatch):
    from conftest import write_distribution

    root = tmp_path / "site"
    root.mkdir()
    for dist, mod, src in (
        ("onnxep_badimport", "onnxep_badimport", BAD_IMPORT),
        ("onnxep_badhook", "onnxep_badhook", BAD_HOOK),
        ("onnxep_conflict", "onnxep_conflict", CONFLICT),
    ):
        write_distribution(root, dist, mod, src, {mod.removeprefix("onnxep_"): f"{mod}:plugin"})
    monkeypatch.syspath_prepend(str(root))
    onnxep.rediscover()
    yield
    for mod in ("onnxep_badimport", "onnxep_badhook", "onnxep_conflict"):
        sys.modules.pop(mod, None)
    onnxep.rediscover()


def _relu_model():
    return make_model(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        [tensor("x", [4])],
        [tensor("y", [4])],
        opset=14,
    )


def test_plugin_whose_import_raises_is_named(broken_plugins):
    sess = onnxep.InferenceSession(_relu_model(), providers=["cpu"])
    (f,) = [f for f in onnxep.plugin_failures() if f.name == "badimport"]
    assert f.entry_point == "onnxep_badimport:plugin" and "libbar" in f.error
    assert "plugin 'badimport' (onnxep_badimport:plugin) failed" in str(f)
    (y,) = sess.run(None, {"x": np.array([-1, 0, 1, 2], np.float32)})
    np.testing.assert_array_equal(y, [0, 0, 1, 2])


def test_plugin_whose_hook_raises_is_named(broken_plugins):
    sess = onnxep.InferenceSession(_relu_model(), providers=["cpu"])
    (f,) = [f for f in onnxep.plugin_failures() if f.name == "badhook"]
    assert f.hook == "onnxep_kernels" and "kernel table corrupted" in f.error
    assert "in hook onnxep_kernels" in str(f)
    (y,) = sess.run(None, {"x": np.array([-1, 0, 1, 2], np.float32)})
    np.testing.assert_array_equal(y, [0, 0, 1, 2])


def test_conflicting_kernel_is_refused_and_reported(broken_plugins):
    sess = onnxep.InferenceSession(_relu_model(), providers=["cpu"])
    (cpu,) = sess.providers
    (c,) = [c for c in cpu.registry.conflicts if c.refused == "conflict"]
    assert c.key == ("", "Relu", 14) and c.kept == "cpu"
    assert str(c) == (
        "kernel ai.onnx::Relu since opset 14 registered by 'conflict' is ignored: "
        "'cpu' registered it first"
    )
    # the provider's own kernel is the one that runs
    (y,) = sess.run(None, {"x": np.array([-1, 0, 1, 2], np.float32)})
    np.testing.assert_array_equal(y, [0, 0, 1, 2])
    # and the refusal is in the process-wide report `onnxep providers` prints
    reports = [str(f) for f in onnxep.plugin_failures() if f.name == "conflict"]
    assert any("registered by 'conflict' is ignored" in r for r in reports)


# -- a fresh virtual environment, as a user installs them ------------------------------


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("examples_venv")
    wheels = tmp / "wheels"
    _pip("wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(ROOT))
    for name in EXAMPLES:
        src = _copy_example(name, tmp)
        _pip("wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src))
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    wheel_files = sorted(str(w) for w in wheels.glob("*.whl"))
    assert len(wheel_files) == 3, wheel_files
    _pip("install", "-q", "--no-deps", "--target", purelib, *wheel_files)
    # Dependencies (torch, numpy, onnx...) come from this environment, as a plain
    # path: its .pth files, our editable install among them, are not processed.
    deps = [p for p in site.getsitepackages() if Path(p).exists()]
    (Path(purelib) / "zz_deps.pth").write_text("\n".join(deps) + "\n")
    return py, tmp


def _run_py(py: Path, code: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(py), "-c", code], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_fresh_venv_lists_the_example_providers(fresh_env):
    py, tmp = fresh_env
    res = subprocess.run(
        [str(py), "-m", "onnxep.cli", "providers"], capture_output=True, text=True, cwd=tmp
    )
    assert res.returncode == 0, res.stderr
    assert "onnxep_torch.plugin:plugin" in res.stdout
    assert "plugins that failed" not in res.stdout


def test_fresh_venv_runs_torch_and_swish(fresh_env):
    py, tmp = fresh_env
    code = (
        "import numpy as np, onnxep, onnx, onnxep_torch, onnxep_swish\n"
        "from onnx import helper, TensorProto as T\n"
        "assert 'site-packages' in onnxep_torch.__file__, onnxep_torch.__file__\n"
        f"assert not onnxep_swish.__file__.startswith({str(ROOT)!r})\n"
        "g = helper.make_graph([\n"
        "  helper.make_node('MatMul', ['x', 'x'], ['m']),\n"
        "  helper.make_node('Swish', ['m'], ['y'], domain='com.example', beta=1.0)],\n"
        "  'g', [helper.make_tensor_value_info('x', T.FLOAT, [3, 3])],\n"
        "  [helper.make_tensor_value_info('y', T.FLOAT, [3, 3])])\n"
        "m = helper.make_model(g, opset_imports=[helper.make_opsetid('', 17),\n"
        "  helper.make_opsetid('com.example', 1)])\n"
        # installing a provider package changes no default: it is opt-in, named
        "assert onnxep.InferenceSession(m).get_providers() == ['cpu']\n"
        "s = onnxep.InferenceSession(m, providers=['torch'])\n"
        "assert s.get_providers() == ['torch', 'cpu'], s.get_providers()\n"
        "x = np.eye(3, dtype=np.float32)\n"
        "(y,) = s.run(None, {'x': x})\n"
        "assert np.allclose(y, x / (1 + np.exp(-x))), y\n"
        "assert s.placement().counts() == {'torch': 1, 'cpu': 1}, s.placement().counts()\n"
        "print('ok')\n"
    )
    res = _run_py(py, code, tmp)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().endswith("ok")
