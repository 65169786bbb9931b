"""The parity kit: assert_parity, per-dtype tolerances, NaN, sequences, random_inputs, CLI."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from conftest import make_model, tensor
from onnx import TensorProto, helper

import onnxep
from onnxep.cli import main
from onnxep.providers import Provider, ProviderInfo, hookimpl, kernel
from onnxep.providers.discovery import unregister_plugin
from onnxep.testing import (
    ParityReport,
    assert_parity,
    backend_suite,
    compare_output,
    random_inputs,
    tolerance,
)


def _relu_model():
    return make_model(
        [
            helper.make_node("Add", ["x", "y"], ["s"], name="add"),
            helper.make_node("Relu", ["s"], ["r"], name="relu"),
        ],
        [tensor("x", ["N", 4]), tensor("y", ["N", 4])],
        [tensor("r", ["N", 4])],
    )


def _runtime_provider(name: str, relu_fn):
    """A provider registered at run time whose only kernel is Relu, computed by ``relu_fn``."""

    @kernel("Relu", since=6, dtypes=["float"])
    def relu(node, xp):
        return lambda x: (relu_fn(xp, x),)

    class Plugin:
        @hookimpl
        def onnxep_provider_info(self):
            return ProviderInfo(name=name, device="cpu")

        @hookimpl
        def onnxep_create_provider(self, options):
            return Provider(name, options)

        @hookimpl
        def onnxep_kernels(self, provider):
            return relu.__onnxep_kernels__ if provider.name == name else None

    return Plugin()


@pytest.fixture
def good_and_bad():
    good = _runtime_provider("good_relu", lambda xp, x: xp.maximum(x, 0))
    # The planted bug: a Relu off by 1e-3, far beyond fp32's tolerance.
    bad = _runtime_provider("bad_relu", lambda xp, x: xp.maximum(x, 0) + np.float32(1e-3))
    onnxep.register_provider(good)
    onnxep.register_provider(bad)
    yield
    unregister_plugin(good)
    unregister_plugin(bad)


def test_assert_parity_passes_on_correct_providers(good_and_bad):
    report = assert_parity(_relu_model(), ["good_relu"], dims={"N": 3})
    assert isinstance(report, ParityReport) and report.ok
    assert report.max_abs("r") == 0.0
    assert [r.output for r in report.results] == ["r"]
    assert report.results[0].shape == (3, 4)


def test_several_provider_lists_are_each_compared(good_and_bad):
    report = assert_parity(_relu_model(), [["good_relu"], ["cpu"]])
    assert [r.providers for r in report.results] == ["good_relu", "cpu"]


def test_planted_wrong_kernel_is_caught_with_output_index_and_values(good_and_bad):
    with pytest.raises(AssertionError) as err:
        assert_parity(_relu_model(), ["bad_relu"], dims={"N": 2}, seed=3)
    msg = str(err.value)
    assert "output 'r'" in msg
    assert "bad_relu" in msg and "cpu" in msg
    assert "worst at index (" in msg
    assert "8 of 8 elements out of tolerance" in msg
    # both values appear: the reference's and the provider's, 1e-3 apart
    report = onnxep.testing.parity_report(_relu_model(), ["bad_relu"], dims={"N": 2}, seed=3)
    (r,) = report.failures
    assert r.got == pytest.approx(r.want + 1e-3, abs=1e-6)
    assert repr(r.got) in msg and repr(r.want) in msg
    assert r.max_abs == pytest.approx(1e-3, rel=1e-3)


def test_a_looser_tolerance_lets_the_planted_error_through(good_and_bad):
    report = assert_parity(_relu_model(), ["bad_relu"], atol=2e-3)
    assert report.max_abs("r") == pytest.approx(1e-3, rel=1e-3)


@pytest.mark.parametrize(
    "dtype, atol, rtol",
    [
        (np.float32, 1e-5, 1e-4),
        (np.float16, 2.5e-3, 1e-3),
        (np.float64, 1e-8, 1e-7),
        (np.int64, 0.0, 0.0),
        (np.bool_, 0.0, 0.0),
    ],
)
def test_tolerances_per_dtype(dtype, atol, rtol):
    assert tolerance(np.dtype(dtype)) == (atol, rtol)


def test_bfloat16_tolerance():
    import ml_dtypes

    assert tolerance(np.dtype(ml_dtypes.bfloat16)) == (2e-2, 1e-2)


def _cmp(got, want, **kw):
    (r,) = compare_output("y", got, want, "p", "ref", **kw)
    return r


def test_float_comparison_uses_the_dtype_tolerance():
    want = np.array([1.0, 2.0], np.float32)
    assert _cmp(want + np.float32(5e-5), want).ok  # within rtol 1e-4 of 1 and 2
    assert not _cmp(want + np.float32(1e-3), want).ok
    half = np.array([1.0, 2.0], np.float16)
    assert _cmp(half + np.float16(2e-3), half).ok  # fp16 allows what fp32 does not


def test_integers_bools_and_strings_must_match_exactly():
    assert not _cmp(np.array([1, 2, 4]), np.array([1, 2, 3])).ok
    r = _cmp(np.array([True, False]), np.array([True, True]))
    assert not r.ok and r.worst == (1,) and "must match exactly" in r.problem
    assert _cmp(np.array(["a", "b"], object), np.array(["a", "b"], object)).ok
    assert not _cmp(np.array(["a", "b"], object), np.array(["a", "c"], object)).ok


def test_nan_must_meet_nan_and_infinities_must_agree():
    want = np.array([np.nan, 1.0, np.inf], np.float32)
    assert _cmp(want.copy(), want).ok
    r = _cmp(np.array([0.0, 1.0, np.inf], np.float32), want)
    assert not r.ok and r.worst == (0,)
    assert not _cmp(np.array([np.nan, np.nan, np.inf], np.float32), want).ok
    assert not _cmp(np.array([np.nan, 1.0, -np.inf], np.float32), want).ok


def test_dtype_and_shape_mismatches_are_named():
    want = np.zeros((2, 2), np.float32)
    assert "dtype float64, want float32" in _cmp(want.astype(np.float64), want).problem
    assert "shape [4], want [2, 2]" in _cmp(np.zeros(4, np.float32), want).problem


def test_sequences_compare_elementwise():
    want = [np.zeros(2, np.float32), np.ones(3, np.float32)]
    got = [np.zeros(2, np.float32), np.array([1, 1, 2], np.float32)]
    rs = compare_output("seq", got, want, "p", "ref")
    assert [r.output for r in rs] == ["seq[0]", "seq[1]"]
    assert rs[0].ok and not rs[1].ok and rs[1].worst == (2,)
    (r,) = compare_output("seq", got[:1], want, "p", "ref")
    assert "sequence of 1, want 2" in r.problem


def test_random_inputs_resolve_dims_and_seed():
    model = _relu_model()
    a = random_inputs(model, dims={"N": 5}, seed=1)
    b = random_inputs(model, dims={"N": 5}, seed=1)
    c = random_inputs(model, dims={"N": 5}, seed=2)
    assert a["x"].shape == (5, 4) and a["x"].dtype == np.float32
    np.testing.assert_array_equal(a["x"], b["x"])
    assert not np.array_equal(a["x"], c["x"])


def test_random_inputs_give_integer_feeds_small_values():
    model = make_model(
        [helper.make_node("Identity", ["ids"], ["o"])],
        [tensor("ids", [2, 3], TensorProto.INT64)],
        [tensor("o", [2, 3], TensorProto.INT64)],
    )
    (ids,) = random_inputs(model).values()
    assert ids.dtype == np.int64 and np.abs(ids).max() <= 100


def test_assert_parity_takes_explicit_inputs(good_and_bad):
    x = np.array([[-1, 0, 1, 2]], np.float32)
    report = assert_parity(_relu_model(), ["good_relu"], inputs={"x": x, "y": x})
    assert report.results[0].shape == (1, 4)


def test_backend_suite_skips_declined_cases_with_the_reason(good_and_bad):
    suite = backend_suite(["good_relu"], pattern=r"^test_(relu|abs)$")
    assert sorted(suite.names) == ["test_abs", "test_relu"]
    outcomes = {o.name: o for o in suite.run_all()}
    assert outcomes["test_relu"].status == "passed"
    abs_case = outcomes["test_abs"]
    assert abs_case.status == "skipped"
    assert "provider 'good_relu' declined Abs: no kernel" in abs_case.reason


def test_backend_suite_catches_a_wrong_kernel(good_and_bad):
    suite = backend_suite(["bad_relu"], pattern=r"^test_relu$")
    (out,) = suite.run_all()
    assert out.status == "failed" and "Mismatched elements" in out.reason
    with pytest.raises(AssertionError, match="test_relu on"):
        suite.check("test_relu")


def test_backend_suite_skips_the_conformance_exclusions():
    suite = backend_suite(["cpu"], pattern=r"^test_bernoulli$")
    (out,) = suite.run_all()
    assert out.status == "skipped"
    assert out.reason == "excluded: the output is random, so it cannot equal the recorded one"
    (ran,) = backend_suite(["cpu"], pattern=r"^test_bernoulli$", default_exclusions=False).cases
    assert ran.name == "test_bernoulli"


def test_backend_suite_failure_carries_the_traceback():
    def relu_that_raises(xp, x):
        raise FloatingPointError("kernel blew up on purpose")

    plugin = _runtime_provider("raising_relu", relu_that_raises)
    onnxep.register_provider(plugin)
    try:
        suite = backend_suite(["raising_relu"], pattern=r"^test_relu$")
        (out,) = suite.run_all()
        assert out.status == "failed" and "kernel blew up on purpose" in out.reason
        assert "relu_that_raises" in out.traceback  # the frame that raised, not just its message
        with pytest.raises(AssertionError, match="test_relu on") as err:
            suite.check("test_relu")
        assert "kernel blew up on purpose" in str(err.value.__cause__)
    finally:
        unregister_plugin(plugin)


def test_backend_suite_test_cases_are_a_unittest_class(good_and_bad):
    import unittest

    cases = backend_suite(["good_relu"], pattern=r"^test_(relu|abs)$").test_cases
    ((name, cls),) = cases.items()
    assert name == "OnnxepNodeSuite_good_relu" and issubclass(cls, unittest.TestCase)
    result = unittest.TestResult()
    unittest.defaultTestLoader.loadTestsFromTestCase(cls).run(result)
    assert result.testsRun == 2 and not result.failures and len(result.skipped) == 1


def test_backend_suite_sample_is_a_stable_cross_section():
    a = backend_suite(["cpu"], sample=20).names
    assert len(a) == 20 and a == backend_suite(["cpu"], sample=20).names


def test_cli_parity_prints_error_statistics(good_and_bad, tmp_path, capsys):
    import onnx

    path = tmp_path / "m.onnx"
    onnx.save(_relu_model(), str(path))
    assert main(["parity", str(path), "--providers", "good_relu", "--dim", "N=2"]) == 0
    out = capsys.readouterr().out
    assert "max abs" in out and "parity: ok" in out and "[2, 4]" in out
    assert main(["parity", str(path), "--providers", "bad_relu", "--seed", "1"]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "worst at index" in out and "output 'r'" in out


def _pytest(tmp_path, *args):
    import subprocess
    import sys

    (tmp_path / "test_p.py").write_text(
        "def test_runs(onnxep_provider):\n    assert isinstance(onnxep_provider, str)\n"
    )
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", *args, "test_p.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )


def _fresh_statuses() -> list[tuple[str, bool, str]]:
    """``(name, available, reason)`` per provider as a fresh process discovers them: this
    process may hold providers other tests registered at run time, the subprocess never does."""
    import json
    import subprocess
    import sys

    code = (
        "import json, onnxep; print(json.dumps([[s.name, s.available, s.reason or '']"
        " for s in onnxep.get_all_providers()]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [tuple(row) for row in json.loads(out.stdout.strip().splitlines()[-1])]


def test_pytest_plugin_parametrizes_and_skips_unavailable(tmp_path):
    statuses = [SimpleNamespace(name=n, available=a, reason=r) for n, a, r in _fresh_statuses()]
    unavailable = [s for s in statuses if not s.available]
    if not unavailable:
        pytest.skip("every discovered provider is available here: none to skip")
    missing = unavailable[0]
    proc = _pytest(tmp_path, f"--onnxep-providers=cpu,{missing.name}")
    out = proc.stdout
    assert "1 passed, 1 skipped" in out, out + proc.stderr
    assert f"provider {missing.name!r} is not available here: {missing.reason}" in out
    # without the option: every discovered provider, each unavailable one a skip with its reason
    proc = _pytest(tmp_path)
    available = len(statuses) - len(unavailable)
    assert f"{available} passed, {len(unavailable)} skipped" in proc.stdout, proc.stdout
    for status in unavailable:
        assert f"provider {status.name!r} is not available here: " in proc.stdout


def test_pytest_plugin_rejects_a_provider_nothing_offers(tmp_path):
    proc = _pytest(tmp_path, "--onnxep-providers=cpu,nope")
    assert proc.returncode == 4, proc.stdout + proc.stderr  # pytest's usage error
    assert "--onnxep-providers: unknown provider 'nope'; discovered providers:" in proc.stderr
    assert "passed" not in proc.stdout


def test_assert_parity_on_sequence_outputs_and_nan_values():
    seq_model = make_model(
        [
            helper.make_node("Log", ["x"], ["l"], name="log"),  # NaN for negative inputs
            helper.make_node("SplitToSequence", ["l"], ["seq"], name="split", axis=0),
        ],
        [tensor("x", [3, 2])],
        [helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None)],
    )
    x = np.array([[-1, 1], [2, -3], [4, 5]], np.float32)
    report = assert_parity(seq_model, ["cpu"], inputs={"x": x})
    assert [r.output for r in report.results] == ["seq[0]", "seq[1]", "seq[2]"]
    assert report.ok


def test_parity_reports_what_the_provider_under_test_ran(good_and_bad):
    """good_relu runs the Relu, the CPU the Add: 1 of 2 compute nodes, said and warned."""
    with pytest.warns(UserWarning, match="good_relu ran 1 of 2 compute nodes"):
        report = assert_parity(_relu_model(), ["good_relu"], dims={"N": 2})
    cov = report.coverage["good_relu"]
    assert (cov.ran, cov.total) == (1, 2)
    assert cov.per_output["r"] == (1, 2)
    ((node, op, to, why),) = cov.fell_back
    assert (node, op, to) == ("add", "Add", "cpu") and "Add" in why
    text = report.format()
    assert "coverage: good_relu ran 1 of 2 compute nodes (50%)" in text
    assert "1 x Add -> cpu" in text and "[1/2 nodes on good_relu]" in text


def test_min_coverage_and_strict_fail_a_partial_run(good_and_bad):
    with pytest.raises(AssertionError, match="ran 1 of 2 compute nodes .50%., under min_coverage"):
        assert_parity(_relu_model(), ["good_relu"], strict=True)
    with pytest.raises(AssertionError, match="under min_coverage 75%"):
        assert_parity(_relu_model(), ["good_relu"], min_coverage=0.75)
    with pytest.warns(UserWarning):
        assert assert_parity(_relu_model(), ["good_relu"], min_coverage=0.5).ok


def test_a_provider_that_ran_nothing_fails_by_default(good_and_bad):
    """Both sides then ran the same CPU kernels: agreement proves nothing."""
    add_only = make_model(
        [helper.make_node("Add", ["x", "y"], ["s"], name="add")],
        [tensor("x", [2]), tensor("y", [2])],
        [tensor("s", [2])],
    )
    with pytest.raises(AssertionError, match="'good_relu' ran none of the 1 compute nodes"):
        assert_parity(add_only, ["good_relu"])
    report = onnxep.testing.parity_report(add_only, ["good_relu"])
    assert not report.ok and not report.failures and report.coverage_problems


def test_cli_parity_prints_coverage_and_strict_fails(good_and_bad, tmp_path, capsys):
    import onnx

    path = tmp_path / "m.onnx"
    onnx.save(_relu_model(), str(path))
    assert main(["parity", str(path), "--providers", "good_relu"]) == 0
    captured = capsys.readouterr()
    assert "coverage: good_relu ran 1 of 2 compute nodes" in captured.out
    assert "warning: good_relu ran 1 of 2 compute nodes" in captured.err
    assert main(["parity", str(path), "--providers", "good_relu", "--strict"]) == 1
    assert "parity: provider 'good_relu' ran 1 of 2" in capsys.readouterr().out
    assert main(["parity", str(path), "--providers", "cpu", "--strict"]) == 0
