"""Text generation on CUDA: the CPU's text, the chooser's tokens, one read a step.

The folder is tests/data/genai/qwen2_fp32 with the test tokenizer
(tests/text_models.py). Greedy and seeded sampled generations must give the
CPU provider's tokens; the token chooser, given the same logits on NumPy and
CuPy, the same ids; a batch of prompts of different lengths, on the
shared-buffer path, each row's tokens alone.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import onnxep
from onnxep.generation.greedy import SHARED
from onnxep.generation.sampling import SearchOptions, TokenChooser

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for text_models
from text_models import make_text_folder  # noqa: E402

cupy = pytest.importorskip("cupy")

PROMPTS = ["Once upon a time", "The quick brown fox", "What is your name?", "Hi"]
SAMPLED = dict(do_sample=True, temperature=1.0, top_k=40, top_p=0.95, seed=3)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_text_folder(tmp_path_factory.mktemp("cuda_text") / "qwen2")


@pytest.fixture(scope="module")
def gens(folder):
    return {
        "cpu": onnxep.Generator(folder, providers=["cpu"]),
        "cuda": onnxep.Generator(folder, providers=["cuda", "cpu"]),
    }


@pytest.mark.parametrize("options", [{}, SAMPLED, {"repetition_penalty": 1.3}])
def test_cuda_gives_the_cpu_text(gens, options):
    for prompt in PROMPTS[:2]:
        cpu = gens["cpu"].generate(prompt, max_new_tokens=24, **options)
        cuda = gens["cuda"].generate(prompt, max_new_tokens=24, **options)
        assert cuda.token_ids == cpu.token_ids, (prompt, options)
        assert cuda.text == cpu.text
        run = cuda.stats.run
        assert run.state_path == SHARED
        # one read a step: the chosen ids (the sampler's draws go up, nothing else comes down)
        assert max(run.device_to_host_reads[1:]) == 1, run.device_to_host_reads


def test_a_ragged_batch_on_the_shared_buffers(gens):
    rows = gens["cuda"].generate(PROMPTS, max_new_tokens=16, eos_token_ids=[])
    assert len({len(r.prompt_ids) for r in rows}) > 2
    for prompt, r in zip(PROMPTS, rows):
        alone = gens["cuda"].generate(prompt, max_new_tokens=16, eos_token_ids=[])
        assert r.token_ids == alone.token_ids, prompt
        assert (
            r.token_ids
            == gens["cpu"].generate(prompt, max_new_tokens=16, eos_token_ids=[]).token_ids
        )


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize(
    "opts",
    [
        SearchOptions(do_sample=True, temperature=0.8),
        SearchOptions(do_sample=True, top_k=50, temperature=1.0),
        SearchOptions(do_sample=True, top_p=0.9, temperature=1.2),
        SearchOptions(do_sample=True, top_k=20, top_p=0.5, repetition_penalty=1.2),
        SearchOptions(repetition_penalty=1.5),
    ],
)
def test_the_chooser_picks_the_same_ids_on_numpy_and_cupy(opts, dtype):
    rng = np.random.default_rng(0)
    batch, vocab = 8, 151936
    prompts = [rng.integers(0, vocab, 30).tolist() for _ in range(batch)]
    host = TokenChooser(SearchOptions(**{**opts.__dict__, "seed": 9}), prompts, vocab)
    dev = TokenChooser(SearchOptions(**{**opts.__dict__, "seed": 9}), prompts, vocab)
    for _ in range(6):
        logits = (rng.standard_normal((batch, vocab)) * 4).astype(dtype)
        a = host(logits, np)
        b = dev(cupy.asarray(logits), cupy)
        assert np.asarray(a).tolist() == cupy.asnumpy(b).tolist()
