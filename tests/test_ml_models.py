"""Classic ML models from the converters people use, against onnxruntime, output by output.

The corpus (tests/ml_corpus.py) fits scikit-learn, LightGBM and XGBoost estimators on
synthetic data and converts them with skl2onnx and onnxmltools at test time; every model
must load, declare the outputs onnxruntime declares, and give onnxruntime's values in
onnxruntime's Python types (labels as int64 or str arrays, ZipMap as a list of dicts).
"""

from __future__ import annotations

import numpy as np
import pytest

import onnxep
from onnxep.testing import compare_output

pytest.importorskip("sklearn")
pytest.importorskip("skl2onnx")
pytest.importorskip("onnxmltools")
pytest.importorskip("lightgbm")
pytest.importorskip("xgboost")
ort = pytest.importorskip("onnxruntime")

from ml_corpus import corpus  # noqa: E402

pytestmark = pytest.mark.mlmodels
CORPUS = corpus()


def _python_types(got, want, where: str) -> None:
    """onnxep's value has onnxruntime's Python shape: arrays, lists of dicts, key types."""
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), f"{where}: {type(got).__name__}, want ndarray"
        assert got.dtype == want.dtype, f"{where}: dtype {got.dtype}, want {want.dtype}"
        return
    assert type(got) is type(want), f"{where}: {type(got).__name__}, want {type(want).__name__}"
    if isinstance(want, list):
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            _python_types(g, w, f"{where}[{i}]")
    elif isinstance(want, dict):
        assert [type(k) for k in got] == [type(k) for k in want], f"{where}: key types"
        assert list(got) == list(want), f"{where}: keys {list(got)}, want {list(want)}"
        assert all(type(v) is type(want[k]) for k, v in got.items()), f"{where}: value types"


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_converted_model_matches_onnxruntime(name):
    model, feeds = CORPUS[name]()
    data = model.SerializeToString()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    ref = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    sess = onnxep.InferenceSession(data, providers=["cpu"])
    assert [(o.name, o.type) for o in sess.get_outputs()] == [
        (o.name, o.type) for o in ref.get_outputs()
    ]
    assert [(i.name, i.type) for i in sess.get_inputs()] == [
        (i.name, i.type) for i in ref.get_inputs()
    ]
    want = ref.run(None, feeds)
    got = sess.run(None, feeds)
    for out, g, w in zip(ref.get_outputs(), got, want):
        _python_types(g, w, out.name)
        for r in compare_output(out.name, g, w, "cpu", "onnxruntime"):
            assert r.ok, r.describe()
    # A second run goes through the generated plan; the same values come back.
    again = sess.run(None, feeds)
    for out, g, w in zip(ref.get_outputs(), again, want):
        for r in compare_output(out.name, g, w, "cpu", "onnxruntime"):
            assert r.ok, r.describe()


def test_zipmap_model_through_parity_kit_and_cli(tmp_path, capsys):
    from onnxep.cli import main
    from onnxep.testing import assert_parity

    model, feeds = CORPUS["skl_random_forest_string_labels"]()
    path = tmp_path / "rf.onnx"
    path.write_bytes(model.SerializeToString())
    report = assert_parity(str(path), ["cpu"], reference=["cpu"], inputs=feeds)
    assert {r.output for r in report.results} == {"output_label", "output_probability"}
    assert any(r.dtype == "map:float32" for r in report.results)
    assert main(["run", str(path), "--max-nodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "seq(map(string,tensor(float)))" in out
    assert main(["parity", str(path), "--providers", "cpu"]) == 0
    assert "parity: ok" in capsys.readouterr().out


def test_map_input_feed_checks():
    model, feeds = CORPUS["skl_dict_vectorizer"]()
    sess = onnxep.InferenceSession(model.SerializeToString(), providers=["cpu"])
    assert sess.get_inputs()[0].type == "map(string,tensor(float))"
    with pytest.raises(onnxep.errors.InvalidArgument, match="must be a dict"):
        sess.run(None, {"X": [1.0, 2.0]})
    with pytest.raises(onnxep.errors.InvalidArgument, match="not a string"):
        sess.run(None, {"X": {3: 1.0}})
    with pytest.raises(onnxep.errors.InvalidArgument, match="not a number"):
        sess.run(None, {"X": {"f1": "x"}})
    (y,) = sess.run(None, feeds)
    assert y.shape == (1, len(model.graph.node[0].attribute[0].strings))
