"""plugins.toml: provider order, enablement, aliases, default options, rewrite switches,
and how sessions place nodes (``[placement]``).

The file at the repository root (copied into the package when a wheel is
built) is the default; a user file named by ``ONNXEP_PLUGINS`` or by
``SessionOptions.plugins_config`` overrides it key by key.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError

ENV_VAR = "ONNXEP_PLUGINS"
_TOP_KEYS = {"order", "providers", "rewrites", "placement"}
_PROVIDER_KEYS = {"enabled", "aliases", "options"}
PLACEMENT_MODES = ("priority", "measured")
#: [placement] keys, each with its check and what it must be
_PLACEMENT_KEYS: dict[str, tuple[Any, str]] = {
    "mode": (lambda v: v in PLACEMENT_MODES, f"one of {', '.join(PLACEMENT_MODES)}"),
    "budget_ms": (
        lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0,
        "a number of milliseconds above 0",
    ),
    "island_nodes": (
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
        "a whole number >= 0",
    ),
}


def placement_problem(key: str, value: Any) -> str | None:
    """What ``[placement]`` key ``key`` must be, when ``value`` is not that; else None."""
    ok, what = _PLACEMENT_KEYS[key]
    return None if ok(value) else what


def default_config_path() -> Path:
    """plugins.toml inside the installed package, else at the source tree's root."""
    here = Path(__file__).resolve().parent.parent  # the onnxep package
    for candidate in (here / "plugins.toml", here.parent / "plugins.toml"):
        if candidate.is_file():
            return candidate
    raise ConfigError(f"onnxep's default plugins.toml is missing (looked in {here})")


@dataclass
class ProviderConfig:
    enabled: bool = True
    aliases: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class PluginsConfig:
    order: list[str] = field(default_factory=list)
    providers: dict[str, ProviderConfig] = field(default_factory=dict)
    rewrites: dict[str, bool] = field(default_factory=dict)
    #: [placement]: mode, budget_ms, island_nodes
    placement: dict[str, Any] = field(default_factory=dict)
    sources: tuple[str, ...] = ()

    def is_enabled(self, name: str) -> bool:
        pc = self.providers.get(name)
        return True if pc is None else pc.enabled

    def options_for(self, name: str) -> dict[str, Any]:
        pc = self.providers.get(name)
        return dict(pc.options) if pc else {}

    def rewrite_enabled(self, name: str) -> bool:
        return self.rewrites.get(name, True)

    @property
    def key(self) -> tuple[str, ...]:
        return self.sources


def _read(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"plugins file {str(path)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"plugins file {str(path)!r} is not valid TOML: {exc}") from None


def _check(data: Mapping[str, Any], path: Path) -> None:
    for key in data:
        if key not in _TOP_KEYS:
            raise ConfigError(
                f"unknown key {key!r} in {str(path)!r}; allowed: {', '.join(sorted(_TOP_KEYS))}"
            )
    order = data.get("order", [])
    if not isinstance(order, list) or not all(isinstance(x, str) for x in order):
        raise ConfigError(f"'order' in {str(path)!r} must be a list of provider names")
    for name, section in data.get("providers", {}).items():
        if not isinstance(section, dict):
            raise ConfigError(f"'providers.{name}' in {str(path)!r} must be a table")
        for key in section:
            if key not in _PROVIDER_KEYS:
                raise ConfigError(
                    f"unknown key 'providers.{name}.{key}' in {str(path)!r}; "
                    f"allowed: {', '.join(sorted(_PROVIDER_KEYS))}"
                )
    for name, value in data.get("rewrites", {}).items():
        if not isinstance(value, bool):
            raise ConfigError(f"'rewrites.{name}' in {str(path)!r} must be true or false")
    for key, value in data.get("placement", {}).items():
        if key not in _PLACEMENT_KEYS:
            raise ConfigError(
                f"unknown key 'placement.{key}' in {str(path)!r}; "
                f"allowed: {', '.join(sorted(_PLACEMENT_KEYS))}"
            )
        what = placement_problem(key, value)
        if what:
            raise ConfigError(f"'placement.{key}' in {str(path)!r} must be {what}, got {value!r}")


def _merge(cfg: PluginsConfig, data: Mapping[str, Any], path: Path) -> None:
    _check(data, path)
    if "order" in data:
        cfg.order = list(data["order"])
    for name, section in data.get("providers", {}).items():
        pc = cfg.providers.setdefault(name, ProviderConfig())
        if "enabled" in section:
            pc.enabled = bool(section["enabled"])
        if "aliases" in section:
            pc.aliases = tuple(section["aliases"])
        if "options" in section:
            pc.options = {**pc.options, **section["options"]}
    cfg.rewrites.update(data.get("rewrites", {}))
    cfg.placement.update(data.get("placement", {}))
    cfg.sources = (*cfg.sources, str(path))


def load_config(user_path: str | os.PathLike | None = None) -> PluginsConfig:
    """The default plugins.toml, overridden by ``user_path`` or ``$ONNXEP_PLUGINS``."""
    cfg = PluginsConfig()
    default = default_config_path()
    _merge(cfg, _read(default), default)
    override = user_path if user_path is not None else os.environ.get(ENV_VAR)
    if override:
        p = Path(override)
        _merge(cfg, _read(p), p)
    return cfg
