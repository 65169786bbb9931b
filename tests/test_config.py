"""plugins.toml: defaults, key-by-key overrides, unknown keys, disabled providers."""

from __future__ import annotations

import pytest
from conftest import make_model, tensor
from onnx import helper

import onnxep
from onnxep.config import default_config_path, load_config
from onnxep.errors import ConfigError, ProviderError


def test_default_config_is_the_repository_file():
    cfg = load_config()
    assert cfg.order[-1] == "cpu"
    assert "CPUExecutionProvider" in cfg.providers["cpu"].aliases
    assert default_config_path().name == "plugins.toml"


def test_user_file_overrides_key_by_key(tmp_path, monkeypatch):
    p = tmp_path / "mine.toml"
    p.write_text(
        '[providers.cuda]\noptions = { arena = "off" }\n[rewrites]\nfold_constants = false\n'
    )
    monkeypatch.setenv("ONNXEP_PLUGINS", str(p))
    cfg = load_config()
    assert cfg.providers["cuda"].options == {"device_id": 0, "arena": "off"}
    assert cfg.providers["cuda"].aliases == ("CUDAExecutionProvider",)
    assert cfg.rewrite_enabled("fold_constants") is False
    assert cfg.rewrite_enabled("remove_dead_nodes") is True


@pytest.mark.parametrize(
    "text, pattern",
    [
        ("colour = 1\n", "unknown key 'colour' in .*bad.toml"),
        ("[providers.cpu]\npriority = 3\n", "unknown key 'providers.cpu.priority' in .*bad.toml"),
        ("order = 'cpu'\n", "'order' in .*must be a list"),
        ("[rewrites]\nfold_constants = 1\n", "'rewrites.fold_constants' .*true or false"),
        ("order = [\n", "not valid TOML"),
    ],
)
def test_bad_files_name_key_and_file(tmp_path, text, pattern):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=pattern):
        load_config(p)


def test_session_options_config_disables_a_provider(tmp_path, toy_dist):
    p = tmp_path / "off.toml"
    p.write_text("[providers.toy]\nenabled = false\n")
    m = make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [1])], [tensor("y", [1])])
    opts = onnxep.SessionOptions(plugins_config=str(p))
    strict = onnxep.SessionOptions(plugins_config=str(p), disable_fallback=True)
    with pytest.raises(ProviderError, match="'toy' .*disabled in plugins.toml"):
        onnxep.InferenceSession(m, strict, providers=["toy"])
    with pytest.warns(UserWarning, match="'toy' is skipped: .*disabled in plugins.toml"):
        onnxep.InferenceSession(m, opts, providers=["toy"])
    sess = onnxep.InferenceSession(m, opts)
    assert "toy" not in sess.get_providers()
    import sys

    # a disabled plugin is never imported
    assert "onnxep_toy" not in sys.modules
