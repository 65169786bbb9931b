"""The text part of the com.microsoft corpus: scikit-learn vectorizers converted by skl2onnx.

skl2onnx writes StringNormalizer, com.microsoft Tokenizer (with a token expression, or with
separators when asked) and TfIdfVectorizer for scikit-learn's TfidfVectorizer and
CountVectorizer. Each pipeline is fitted on a small corpus here, converted, and run by
onnxep's CPU provider and onnxruntime's on unseen sentences (punctuation, non-ASCII words,
an empty string, a sentence with no known word).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import onnxep

ort = pytest.importorskip("onnxruntime")
sklearn_text = pytest.importorskip("sklearn.feature_extraction.text")
skl2onnx = pytest.importorskip("skl2onnx")

pytestmark = pytest.mark.contribmodels

TRAIN = [
    "The quick brown fox jumps over the lazy dog.",
    "Never jump over the lazy dog quickly!",
    "A quick movement of the enemy will jeopardize six gunboats.",
    "The five boxing wizards jump quickly; the dog sleeps.",
    "Pack my box with five dozen liquor jugs, said the fox.",
    "Über-quick foxes and naïve dogs: a café story.",
]
TEST = [
    "the quick dog jumps",
    "Foxes, dogs, and wizards!",
    "",
    "zebra yak",
    "Naïve café dogs jump over five boxes... quickly",
    "THE LAZY FOX",
]

#: name -> (vectorizer class, its parameters, skl2onnx options for it)
PIPELINES = {
    "tfidf_words": ("TfidfVectorizer", {"norm": None}, {}),
    "tfidf_bigrams": ("TfidfVectorizer", {"norm": None, "ngram_range": (1, 2)}, {}),
    "tfidf_sublinear": ("TfidfVectorizer", {"norm": None, "sublinear_tf": True}, {}),
    "tfidf_chars": (
        "TfidfVectorizer",
        {"norm": None, "analyzer": "char", "ngram_range": (1, 3)},
        {},
    ),
    "tfidf_cased_pattern": (
        "TfidfVectorizer",
        {"norm": None, "lowercase": False, "token_pattern": r"\b\w+\b"},
        {},
    ),
    "tfidf_separators": (
        "TfidfVectorizer",
        {"norm": None},
        {"tokenexp": None, "separators": [" ", "[.]", "\\?", ",", ";", ":", "\\!", "-"]},
    ),
    "count_words": ("CountVectorizer", {}, {}),
    "count_bigrams": ("CountVectorizer", {"ngram_range": (1, 2), "binary": True}, {}),
    "tfidf_l2": ("TfidfVectorizer", {}, {}),
}


#: pipelines whose converted model is not scikit-learn's transform, whoever runs it
NOT_SKLEARN = {
    "tfidf_separators": "separators instead of scikit-learn's token pattern",
    "tfidf_sublinear": "skl2onnx's sublinear_tf differs from scikit-learn's",
}


def convert(name: str):
    from skl2onnx.common.data_types import StringTensorType

    cls, params, options = PIPELINES[name]
    vec = getattr(sklearn_text, cls)(**params).fit(TRAIN)
    model = skl2onnx.convert_sklearn(
        vec,
        initial_types=[("text", StringTensorType([None, 1]))],
        options={id(vec): options} if options else None,
        target_opset={"": 17, "ai.onnx.ml": 3},
    )
    # StringNormalizer's locale defaults to en_US.UTF-8, which onnxruntime cannot build
    # where that locale is not installed (CI's machine); C.UTF-8 lowercases the same
    for node in model.graph.node:
        if node.op_type == "StringNormalizer":
            kept = [a for a in node.attribute if a.name != "locale"]
            del node.attribute[:]
            node.attribute.extend([*kept, onnx.helper.make_attribute("locale", "C.UTF-8")])
    return vec, model


def _claims(domain: str, op: str) -> bool:
    from onnxep.providers import KernelLibrary

    lib = KernelLibrary.from_package("onnxep.providers.ops")
    lib = lib + KernelLibrary.from_package("onnxep.providers_cpu.ops")
    return (domain, op) in lib.op_types()


@pytest.mark.parametrize("name", list(PIPELINES))
def test_text_pipeline_matches_onnxruntime(name):
    vec, model = convert(name)
    ops = {(n.domain, n.op_type) for n in model.graph.node}
    assert ("com.microsoft", "Tokenizer") in ops, sorted(ops)
    for domain, op in ops:
        if domain == "ai.onnx.ml" and not _claims(domain, op):
            pytest.skip(f"{domain} {op} is not an onnxep kernel on this branch")
    feeds = {"text": np.array(TEST, dtype=object).reshape(-1, 1)}
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = ref.run(None, feeds)
    got = onnxep.InferenceSession(model, providers=["cpu"]).run(None, feeds)
    for g, r in zip(got, expected):
        assert g.shape == r.shape and g.dtype == r.dtype
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
    # and, on ASCII text, the model says what scikit-learn says (skl2onnx's token
    # expression is ASCII-only where scikit-learn's is Unicode)
    if name not in NOT_SKLEARN:
        ascii_rows = [i for i, t in enumerate(TEST) if t.isascii()]
        want = vec.transform([TEST[i] for i in ascii_rows]).toarray()
        np.testing.assert_allclose(got[0][ascii_rows], want, rtol=1e-4, atol=1e-5)
