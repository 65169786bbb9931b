"""Every code block of the guides runs: Python blocks in order, TOML blocks parse."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

import onnxep
from onnxep.plugins import host as discovery

ROOT = Path(__file__).resolve().parents[1]
GUIDES = [ROOT / "docs" / "providers.md"]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(path: Path, lang: str) -> list[str]:
    return [code for kind, code in FENCE.findall(path.read_text()) if kind == lang]


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: p.name)
def test_python_blocks_run_in_order(guide, tmp_path, monkeypatch):
    code = blocks(guide, "python")
    assert code, f"{guide} has no python blocks"
    monkeypatch.chdir(tmp_path)
    before = discovery.runtime_plugins()
    namespace: dict = {"__name__": "guide"}
    try:
        for i, src in enumerate(code):
            try:
                exec(compile(src, f"{guide.name}[python block {i}]", "exec"), namespace)
            except Exception as exc:
                raise AssertionError(f"python block {i} of {guide.name} failed:\n{src}") from exc
    finally:
        for plugin in discovery.runtime_plugins():
            if not any(plugin is p for p in before):
                discovery.unregister_plugin(plugin)
        onnxep.rediscover()


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: p.name)
def test_toml_blocks_parse(guide):
    for src in blocks(guide, "toml"):
        tomllib.loads(src)


def test_the_guide_documents_every_hook():
    from onnxep.providers import hookspecs

    text = GUIDES[0].read_text()
    hooks = [n for n in vars(hookspecs) if n.startswith("onnxep_")]
    assert hooks
    for name in hooks:
        assert f"`{name}(" in text, f"docs/providers.md does not document hook {name}"
