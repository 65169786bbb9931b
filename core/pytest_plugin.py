"""pytest plugin (entry point ``pytest11``): run a test once per onnxep provider.

``pytest --onnxep-providers=cuda,cpu`` picks the providers (default: every
discovered one); a test that takes the ``onnxep_provider`` fixture runs once
for each, and is skipped, with the reason, where a provider is not available.
onnxep itself is imported only when a test asks for the fixture, so the
plugin costs nothing in other projects' test runs.
"""

from __future__ import annotations

from typing import Any

import pytest

OPTION = "--onnxep-providers"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("onnxep")
    group.addoption(
        OPTION,
        default=None,
        metavar="NAMES",
        help="comma-separated onnxep providers for the onnxep_provider fixture "
        "(default: every discovered provider)",
    )


def requested_providers(config: pytest.Config) -> list[str]:
    """The names ``--onnxep-providers`` lists, else every discovered provider."""
    raw = config.getoption(OPTION, default=None)
    if raw:
        return [p.strip() for p in raw.split(",") if p.strip()]
    import onnxep

    return [s.name for s in onnxep.get_all_providers()]


def unavailable_reason(name: str) -> str | None:
    """``None`` when provider ``name`` (or an alias) can run here, else why not."""
    import onnxep

    low = name.lower()
    for s in onnxep.get_all_providers():
        if low == s.name.lower() or low in {a.lower() for a in s.aliases}:
            return None if s.available else s.reason or "unavailable"
    for f in onnxep.plugin_failures():
        if f.name.lower() == low:
            return f"its plugin failed to load: {f.error}"
    known = ", ".join(s.name for s in onnxep.get_all_providers()) or "none"
    return f"no such provider is installed (discovered: {known})"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "onnxep_provider" in metafunc.fixturenames:
        names = requested_providers(metafunc.config)
        metafunc.parametrize("onnxep_provider", names, ids=names, indirect=True)


@pytest.fixture
def onnxep_provider(request: pytest.FixtureRequest) -> Any:
    """One provider name from ``--onnxep-providers``; skips where it cannot run."""
    name = request.param
    why = unavailable_reason(name)
    if why is not None:
        pytest.skip(f"provider {name!r} is not available here: {why}")
    return name
