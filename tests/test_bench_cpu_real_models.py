"""bench/cpu_real_models.py runs, and bench/run_all.py keeps other benchmarks' doc sections
(never a timed assert)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
pytest.importorskip("onnxruntime")


def test_real_model_benchmark_on_a_corpus_model(tmp_path, monkeypatch):
    """The corpus's one model that needs no download (it ships inside onnxruntime's own
    wheel), run by both sides; every sample kept, the ratio and summary from the medians."""
    from bench import cpu_real_models

    monkeypatch.setattr(cpu_real_models, "RESULTS", tmp_path)
    doc = cpu_real_models.main(["--only", "ort-sigmoid", "--runs", "6", "--seconds", "0.1"])
    r = doc["results"]["ort-sigmoid"]
    assert len(r["samples_s"]["onnxep"]) == len(r["samples_s"]["onnxruntime"]) == 6
    med = r["median_ms"]
    assert r["ratio"] == pytest.approx(med["onnxep"] / med["onnxruntime"])
    pairs = [a / b for a, b in zip(r["samples_s"]["onnxep"], r["samples_s"]["onnxruntime"])]
    assert r["pair_ratio"] == pytest.approx(float(np.median(pairs)))
    assert doc["summary"]["models"] == 1 and doc["summary"]["max_model"] == "ort-sigmoid"
    md = (tmp_path / f"{doc['date']}-cpu-real-models.md").read_text()
    assert "| ort-sigmoid | 1 |" in md and "median ratio" in md
    assert (tmp_path / f"{doc['date']}-cpu-real-models.json").exists()


def test_a_thread_count_applies_to_both_sides_and_is_recorded(tmp_path, monkeypatch):
    from bench import cpu_real_models

    monkeypatch.setattr(cpu_real_models, "RESULTS", tmp_path)
    seen = []
    real = cpu_real_models.ort_session
    monkeypatch.setattr(cpu_real_models, "ort_session", lambda p, t: seen.append(t) or real(p, t))
    argv = ["--only", "ort-sigmoid", "--runs", "5", "--seconds", "0.1", "--threads", "1"]
    doc = cpu_real_models.main([*argv, "--tag", "t1"])
    assert seen == [1] and doc["threads"] == 1
    md = (tmp_path / f"{doc['date']}-cpu-real-models-t1.md").read_text()
    assert "intra_op_num_threads 1" in md


def _onnxep_refuses_logreg(monkeypatch) -> None:
    """onnxep refusing the corpus's other model that ships in onnxruntime's wheel (it runs
    it since LinearClassifier reads the coefficients as onnxruntime does): a refused row."""
    import onnxep
    from onnxep.errors import NotSupported

    real = onnxep.InferenceSession

    def session(path, *args, **kwargs):
        if "logreg" in str(path):
            raise NotSupported("LinearClassifier: refused for this test")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(onnxep, "InferenceSession", session)


def test_a_model_one_side_refuses_is_listed_not_timed(tmp_path, monkeypatch):
    from bench import cpu_real_models

    monkeypatch.setattr(cpu_real_models, "RESULTS", tmp_path)
    _onnxep_refuses_logreg(monkeypatch)
    doc = cpu_real_models.main(["--only", "ort-logreg-iris", "--no-write"])
    assert "skipped" in doc["results"]["ort-logreg-iris"]
    assert doc["summary"] == {}
    assert list(tmp_path.iterdir()) == []


def test_run_all_rebuild_keeps_level_two_sections():
    from bench.run_all import _other_sections

    text = "# Benchmarks\n\n### m (date)\n\n| a |\n\n## CPU provider\n\nkept\n\n## Other\n\nalso\n"
    assert _other_sections(text) == "## CPU provider\n\nkept\n\n## Other\n\nalso\n"
    assert _other_sections("# Benchmarks\n\n### m\n") == ""


def test_run_all_dims_name_dims_of_their_models(tmp_path):
    """A dim the model does not have is ignored by the harness, and the input would take
    the default size instead (the BERT entry once ran 1 token, not 64, that way)."""
    import onnx

    from bench.make_models import build
    from bench.run_all import GENERATED, STANDARD

    def dim_names(path):
        proto = onnx.load(str(path), load_external_data=False)
        return {d.dim_param for v in proto.graph.input for d in v.type.tensor_type.shape.dim}

    for name, (path, kw) in STANDARD.items():
        assert set(kw.get("dims", {})) <= dim_names(path), name
    for name, ((kind, size, dtype), kw) in GENERATED.items():
        if kw.get("dims") and kind == "bert":
            path = build(kind, size or "tiny", dtype or "fp32", tmp_path, 0, "2d")
            assert set(kw["dims"]) <= dim_names(path), name


def test_single_model_runs_merge_into_one_table(tmp_path, monkeypatch):
    from bench import cpu_real_models

    _onnxep_refuses_logreg(monkeypatch)

    for name in ("ort-sigmoid", "ort-logreg-iris"):
        cpu_real_models.main(
            [
                "--only",
                name,
                "--runs",
                "5",
                "--seconds",
                "0.1",
                "--out",
                str(tmp_path),
                "--tag",
                name,
            ]
        )
    files = sorted(tmp_path.glob("*.json"))
    assert len(files) == 2
    doc = cpu_real_models.main(["--merge", *map(str, files), "--out", str(tmp_path / "m")])
    # corpus order, whatever the order of the files
    assert list(doc["results"]) == ["ort-logreg-iris", "ort-sigmoid"]
    assert doc["summary"]["models"] == 1
    assert len(doc["results"]["ort-sigmoid"]["samples_s"]["onnxep"]) == 5
