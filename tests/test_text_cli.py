"""``onnxep generate MODEL_DIR --prompt ...``, run as the installed console script.

stdout must hold exactly the generated text (onnxruntime-genai's greedy
tokens, decoded), stderr the prompt's length, the time to the first token and
tokens per second; errors are one sentence on stderr with exit code 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_cli import onnxep as onnxep_cli
from test_text_generation import genai_greedy
from text_models import GENAI, make_text_folder, train_tokenizer

import onnxep


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_text_folder(tmp_path_factory.mktemp("cli") / "qwen2")


@pytest.fixture(scope="module")
def gen(folder) -> onnxep.Generator:
    return onnxep.Generator(folder, providers=["cpu"])


def test_generate_streams_genai_greedy_text_to_stdout(folder, gen):
    prompt = "Once upon a time"
    res = onnxep_cli("generate", str(folder), "--prompt", prompt, "--max-new-tokens", "20")
    assert res.returncode == 0, res.stderr
    ids = gen.encode(prompt)
    tokens = genai_greedy(folder, ids, 20)
    # special tokens are left out of the text; stdout ends with one newline
    assert res.stdout == train_tokenizer().decode(tokens, skip_special_tokens=True) + "\n"
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"onnxep: prompt {len(ids)} tokens, {len(tokens)} new tokens")
    assert "first token" in line and "tokens/s on cpu" in line


def test_sampling_options_and_the_chat_template(folder, gen):
    args = ["--prompt", "What is your name?", "--max-new-tokens", "16"]
    sampled = ["--temperature", "0.9", "--top-k", "30", "--top-p", "0.95", "--seed", "4"]
    a = onnxep_cli("generate", str(folder), *args, *sampled, "--chat")
    b = onnxep_cli("generate", str(folder), *args, *sampled, "--chat")
    assert a.returncode == 0, a.stderr
    assert a.stdout == b.stdout  # the seed repeats it
    want = gen.generate(
        "What is your name?",
        chat=True,
        max_new_tokens=16,
        do_sample=True,
        temperature=0.9,
        top_k=30,
        top_p=0.95,
        seed=4,
    )
    assert a.stdout == want.text + "\n"
    greedy = onnxep_cli("generate", str(folder), *args, "--temperature", "0")
    assert greedy.stdout == gen.generate("What is your name?", max_new_tokens=16).text + "\n"


def test_a_stop_string_ends_the_output(folder, gen):
    prompt = "The quick brown fox"
    stop = gen.generate(prompt, max_new_tokens=24).text[6:9]
    res = onnxep_cli("generate", str(folder), "--prompt", prompt, "--stop", stop)
    assert res.returncode == 0, res.stderr
    want = gen.generate(prompt, max_new_tokens=24, stop=stop)
    assert want.finish_reason == "stop"
    assert res.stdout == want.text + "\n"
    assert res.stderr.rstrip().endswith(f"ended at stop string {stop!r}")


@pytest.mark.parametrize(
    "argv, first_line",
    [
        (["--temperature", "-1"], "onnxep: error: argument --temperature: -1 is not a finite"),
        (["--temperature", "hot"], "onnxep: error: argument --temperature: 'hot' is not a number"),
        (["--top-p", "1.5"], "onnxep: error: argument --top-p: '1.5' is not a fraction from 0"),
        (["--top-k", "-3"], "onnxep: error: argument --top-k: -3 is negative"),
        (["--max-new-tokens", "0"], "onnxep: error: argument --max-new-tokens: 0 is out of range"),
        (["--seed", "x"], "onnxep: error: argument --seed: 'x' is not an integer"),
        (["--repetition-penalty", "0"], "onnxep: error: argument --repetition-penalty: '0' is not"),
        (["--stop", ""], "onnxep: error: argument --stop: an empty stop string"),
        (["--system", "be kind"], "onnxep: error: --system is the chat's first message"),
        (["--greedy", "--do-sample"], "onnxep: error: --greedy and --do-sample contradict"),
        (["--max-new-tokens", "300"], "onnxep: error: a 7-token prompt and max_new_tokens 300"),
        (["--top-k", "600"], "onnxep: error: top_k 600 is more than the model's 512 tokens"),
    ],
)
def test_bad_values_are_one_sentence_and_exit_2(folder, argv, first_line):
    res = onnxep_cli("generate", str(folder), "--prompt", "Once upon a time", *argv)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.splitlines()[0].startswith(first_line), res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""


def test_missing_tokenizer_long_prompt_and_bad_folders_exit_2(tmp_path, folder):
    bare = make_text_folder(tmp_path / "bare", tokenizer=False)
    cases = [
        ([str(bare), "--prompt", "Hi"], f"onnxep: error: {bare} has no tokenizer.json"),
        (
            [str(folder), "--prompt", "Once upon a time " * 80],
            "onnxep: error: the prompt is 640 tokens, and the model's context length (256)",
        ),
        ([str(tmp_path / "nope"), "--prompt", "Hi"], "onnxep: error: argument MODEL_DIR"),
        ([str(GENAI), "--prompt", "Hi"], "onnxep: error: '"),
        ([str(folder)], "onnxep: error: the following arguments are required: --prompt"),
    ]
    for argv, first_line in cases:
        res = onnxep_cli("generate", *argv)
        assert res.returncode == 2, (argv, res.stderr)
        assert res.stderr.splitlines()[0].startswith(first_line), res.stderr
        assert "Traceback" not in res.stderr


def test_generate_help():
    res = onnxep_cli("generate", "--help")
    assert res.returncode == 0 and "--max-new-tokens" in res.stdout and "stderr" in res.stdout
