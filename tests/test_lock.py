"""The test environment is the lock: every package installed in it is pinned in
constraints.txt at the version installed, so the same commit gives the same result next month
(an unpinned transitive dependency is how drift gets in). tools/test_newest.sh runs on the
newest releases on purpose and sets ONNXEP_NEWEST=1, which skips this check."""

from __future__ import annotations

import importlib.metadata
import os
import re
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: pip does not list these in a freeze; the lock need not pin them
_TOOLING = {"pip", "setuptools", "wheel", "onnxep"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[_norm(name)] = version.strip()
    return out


def test_every_installed_package_is_pinned_at_its_version():
    if os.environ.get("ONNXEP_NEWEST"):
        pytest.skip("tools/test_newest.sh runs on the newest releases, not the lock")
    site = {Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    pins = _pins()
    unpinned, moved = [], []
    for dist in importlib.metadata.distributions():
        where = Path(dist.locate_file("")).resolve()
        name = _norm(dist.metadata["Name"] or "")
        if where not in site or not name or name in _TOOLING:
            continue  # a test's throw-away plugin, or the installer itself
        version = dist.version.split("+")[0]
        if name not in pins:
            unpinned.append(f"{name}=={version}")
        elif pins[name] != version:
            moved.append(f"{name} {version} (constraints.txt pins {pins[name]})")
    assert not unpinned and not moved, (
        f"the environment is not the lock: unpinned {unpinned}, other versions {moved}; "
        "install with -c constraints.txt, or regenerate it (CONTRIBUTING.md)"
    )
