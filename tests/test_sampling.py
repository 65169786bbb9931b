"""onnxep.sampling: the token chooser against transformers' definitions, written out per row.

``reference`` applies the repetition penalty, temperature, top-k (the k-th
highest logit and everything tied with it) and top-p (transformers' rule: a
token goes when the probability mass of the tokens below it and itself is at
most 1 - p) to one row with Python loops, and samples by inverse CDF over the
survivors ranked by logit (ties by index) from the same uniform number. The
chooser must give the same token for every row and draw, and its draws must
follow the filtered distribution.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from onnxep.errors import InvalidArgument
from onnxep.generation.sampling import SearchOptions, TokenChooser, needs_chooser, search_options


def reference(logits, seen, u, *, temperature=1.0, top_k=0, top_p=1.0, penalty=1.0):
    x = [float(v) for v in logits]
    for t in seen:
        x[t] = x[t] / penalty if x[t] > 0 else x[t] * penalty
    x = [v / temperature for v in x]
    ranked = sorted(range(len(x)), key=lambda i: (-x[i], i))
    keep = list(ranked)
    if 0 < top_k < len(x):
        kth = x[ranked[top_k - 1]]
        keep = [i for i in ranked if x[i] >= kth]
    m = x[keep[0]]
    w = {i: math.exp(x[i] - m) for i in keep}
    if 0 < top_p < 1:
        total = sum(w.values())
        below = 0.0  # mass of the kept tokens ranked below, and the token itself
        cut = []
        for i in reversed(keep):
            below += w[i] / total
            if below <= 1 - top_p:
                cut.append(i)
        keep = [i for i in keep if i not in cut] or keep[:1]
    total = sum(w[i] for i in keep)
    acc = 0.0
    for i in keep:
        acc += w[i]
        if acc > u * total:
            return i
    return keep[-1]


def choose(opts, logits, prompts=None, draws=None):
    prompts = prompts if prompts is not None else [[] for _ in logits]
    c = TokenChooser(opts, prompts, logits.shape[1])
    if draws is not None:
        c.uniforms = lambda: draws
    return c(logits, np), c


CASES = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=5),
    dict(temperature=1.3, top_p=0.8),
    dict(temperature=0.9, top_k=12, top_p=0.6),
    dict(temperature=1.0, top_k=3, penalty=1.8),
    dict(temperature=2.0, top_p=0.3, penalty=0.7),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_each_choice_is_the_reference_one(case, dtype):
    rng = np.random.default_rng(1)
    rows, vocab = 64, 40
    logits = (rng.standard_normal((rows, vocab)) * 3).astype(dtype)  # float16 rounds to ties
    prompts = [rng.integers(0, vocab, rng.integers(1, 6)).tolist() for _ in range(rows)]
    draws = rng.random(rows)
    opts = SearchOptions(
        do_sample=True,
        temperature=case["temperature"],
        top_k=case.get("top_k", 0),
        top_p=case.get("top_p", 1.0),
        repetition_penalty=case.get("penalty", 1.0),
    )
    ids, _ = choose(opts, logits, prompts, draws)
    ref_kw = {k: v for k, v in case.items()}
    # the chooser computes in float32, as the reference must to break the same ties
    want = [
        reference(logits[r].astype(np.float32), set(prompts[r]), draws[r], **ref_kw)
        for r in range(rows)
    ]
    assert ids.tolist() == want


def test_draws_follow_the_filtered_distribution():
    logits = np.log(np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04]))
    rows = 20000
    batch = np.tile(logits, (rows, 1)).astype(np.float32)
    # top-k 4 leaves [.4 .25 .15 .1]; top-p 0.7 of those (mass .9) keeps .4, .25 (sum
    # .65/.9 = .72 >= .7)
    opts = SearchOptions(do_sample=True, top_k=4, top_p=0.7, seed=0)
    ids, _ = choose(opts, batch)
    counts = np.bincount(ids, minlength=6) / rows
    expect = np.array([0.4, 0.25, 0, 0, 0, 0]) / 0.65
    assert np.abs(counts - expect).max() < 0.015, counts
    opts = SearchOptions(do_sample=True, temperature=2.0, seed=1)
    ids, _ = choose(opts, batch)
    p = np.exp(logits / 2.0) / np.exp(logits / 2.0).sum()
    assert np.abs(np.bincount(ids, minlength=6) / rows - p).max() < 0.015


def test_ties_at_the_k_th_logit_stay_as_in_transformers():
    logits = np.array([[1.0, 3.0, 2.0, 2.0, 2.0, 0.0]], np.float32)
    opts = SearchOptions(do_sample=True, top_k=2, temperature=1.0)
    got = set()
    for u in np.linspace(0, 0.999, 50):
        ids, _ = choose(opts, logits, draws=np.array([u]))
        got.add(int(ids[0]))
    assert got == {1, 2, 3, 4}  # the three tied at the 2nd value all stay


def test_the_repetition_penalty_follows_the_tokens_chosen():
    # transformers: seen positive logits are divided, negative ones multiplied
    logits = np.array([[2.0, 1.9, -1.0, -1.05]], np.float32)
    c = TokenChooser(SearchOptions(repetition_penalty=2.0), [[3]], 4)
    assert c(logits, np).tolist() == [0]  # [2.0, 1.9, -1.0, -2.1]
    assert c(logits, np).tolist() == [1]  # 0 seen: [1.0, 1.9, -1.0, -2.1]
    assert c(logits, np).tolist() == [0]  # 1 seen: [1.0, 0.95, -1.0, -2.1]
    negative = np.array([[-0.5, -0.6]], np.float32)
    c = TokenChooser(SearchOptions(repetition_penalty=2.0), [[0]], 2)
    assert c(negative, np).tolist() == [1]  # the prompt's token: -0.5 * 2 = -1.0


def test_seeded_draws_repeat_and_a_batch_draws_one_number_a_row():
    logits = np.zeros((3, 50), np.float32)
    opts = SearchOptions(do_sample=True, seed=42)
    a = TokenChooser(opts, [[]] * 3, 50)
    b = TokenChooser(opts, [[]] * 3, 50)
    first = [a(logits, np).tolist() for _ in range(4)]
    assert first == [b(logits, np).tolist() for _ in range(4)]
    draws = np.random.default_rng(42).random(12).reshape(4, 3)
    assert first == (draws * 50).astype(int).tolist()  # uniform logits: rank = floor(u * V)


def test_greedy_is_the_argmax_and_needs_no_chooser():
    assert not needs_chooser(SearchOptions())
    assert not needs_chooser(SearchOptions(do_sample=True, temperature=0.0))
    assert not needs_chooser(SearchOptions(do_sample=True, top_k=1))
    assert needs_chooser(SearchOptions(repetition_penalty=1.2))
    assert needs_chooser(SearchOptions(do_sample=True))
    logits = np.random.default_rng(0).standard_normal((5, 30)).astype(np.float32)
    ids, _ = choose(SearchOptions(repetition_penalty=1.0001), logits)
    assert ids.tolist() == logits.argmax(-1).tolist()


def test_options_merge_given_over_the_config():
    config = {"do_sample": True, "top_k": 50, "top_p": 0.9, "temperature": 0.6}
    o = search_options(config, temperature=1.1, seed=None)
    assert (o.do_sample, o.top_k, o.top_p, o.temperature, o.seed) == (True, 50, 0.9, 1.1, None)
    assert search_options({"random_seed": -1}).seed is None  # genai: seed from the system
    assert search_options({"random_seed": 9}).seed == 9
    assert search_options(None, stop="###").stop == ("###",)
    assert search_options({"eos_token_ids": (2, 0)}, eos_token_ids=[]).eos_token_ids == ()
    with pytest.raises(InvalidArgument, match="top_k 60 is more than the model's 50 tokens"):
        TokenChooser(SearchOptions(do_sample=True, top_k=60), [[]], 50)
