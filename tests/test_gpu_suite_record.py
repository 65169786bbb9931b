"""The project's GPU rule, held in CI: the newest change to what the GPU suite covers has a
whole ``tests/cuda`` run on the GPU machine recorded at it or after it, with nothing failing.

CI has no GPU, so a change to the CUDA provider could land without its tests ever running;
this test makes that a red CI run instead of a surprise for the next person
(CONTRIBUTING.md, "Changes the GPU suite covers"). Records: bench/results/gpu-suite.jsonl,
written by bench/record_gpu_suite.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "bench" / "results" / "gpu-suite.jsonl"
#: What the GPU suite covers: the CUDA provider, its tests, and the capture runner, IO
#: binding and decoding loop it drives (kept in step with CONTRIBUTING.md).
GPU_PATHS = (
    "providers_cuda",
    "tests/cuda",
    "core/capture",
    "providers/capture.py",
    "core/iobinding.py",
    "core/compiled_model.py",
    "core/generation",
)


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def _history_or_skip() -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the GPU rule is checked from the history")
    if _git("rev-parse", "--is-inside-work-tree").stdout.strip() != "true":
        pytest.skip("not a git checkout: the GPU rule is checked from the history")
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("a shallow clone lacks the history the GPU rule is checked against")


def _records() -> list[dict]:
    if not RECORDS.is_file():
        return []
    return [json.loads(line) for line in RECORDS.read_text().splitlines() if line.strip()]


def _green(r: dict) -> bool:
    return bool(
        r.get("whole") and r.get("failed") == 0 and r.get("errors") == 0 and r.get("passed")
    )


def test_newest_gpu_change_has_a_green_whole_suite_run():
    """Green, or, where the GPU machine was out of reach, a not-run record saying why: the
    state is always written down, never silent (a not-run record passes with a warning,
    and the next session's first job is the whole suite: CONTRIBUTING.md)."""
    import warnings

    _history_or_skip()
    last = _git("log", "-1", "--format=%H", "--", *GPU_PATHS).stdout.strip()
    if not last:
        pytest.skip("no commit touches the GPU suite's paths")
    covering = [
        r
        for r in _records()
        if _git("merge-base", "--is-ancestor", last, r["commit"]).returncode == 0
    ]
    subject = _git("log", "-1", "--format=%h %s", last).stdout.strip()
    if any(_green(r) for r in covering):
        return
    unrun = [r for r in covering if r.get("not_run")]
    assert unrun, (
        f"the newest change to the GPU suite's paths ({subject[:100]}) has no green whole "
        f"tests/cuda run recorded at it or after it in {RECORDS.relative_to(ROOT)}: run "
        "bench/gpu_check.sh tests on the GPU machine at the final commit and append its "
        "record with bench/record_gpu_suite.py --append; where no GPU machine can be had, "
        "record why with --not-run (CONTRIBUTING.md)"
    )
    warnings.warn(
        f"tests/cuda was not run at or after {subject[:80]}: {unrun[-1]['not_run']}",
        UserWarning,
        stacklevel=1,
    )


def test_records_name_commits_of_this_history():
    _history_or_skip()
    for r in _records():
        run = {"commit", "date", "device", "whole", "passed", "failed"}
        assert run <= r.keys() or {"commit", "date", "not_run"} <= r.keys(), r
        known = _git("cat-file", "-e", f"{r['commit']}^{{commit}}").returncode == 0
        assert known, f"{RECORDS.name} names commit {r['commit']!r}, which is not in history"
