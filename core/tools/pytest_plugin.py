"""pytest plugin (entry point ``pytest11``): run a test once per onnxep provider.

``pytest --onnxep-providers=cuda,cpu`` picks the providers (default: every
discovered one); a test that takes the ``onnxep_provider`` fixture runs once
for each, and is skipped, with the reason, where a provider is not available
here (no device, its plugin failed to load or is disabled). A name that no
installed plugin answers to is a usage error, not a skip: a typo must not
pass as "nothing to test". A provider whose own plugin fails to start it is
broken: a test fails with the plugin's error when the option named the
provider, and is skipped with it otherwise (as sessions do). onnxep itself is
imported only when the option is given or a test asks for the fixture, so
the plugin costs nothing in other projects' test runs.
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


def _listed(config: pytest.Config) -> list[str]:
    raw = config.getoption(OPTION, default=None)
    return [p.strip() for p in raw.split(",") if p.strip()] if raw else []


def pytest_configure(config: pytest.Config) -> None:
    names = _listed(config)
    if not names:
        return
    from onnxep.errors import ProviderError
    from onnxep.plugins.registration import provider_unavailable_reason

    for name in names:
        try:
            provider_unavailable_reason(name)
        except ProviderError as exc:
            raise pytest.UsageError(f"{OPTION}: {exc}") from exc


def requested_providers(config: pytest.Config) -> list[str]:
    """The names ``--onnxep-providers`` lists, else every discovered provider."""
    names = _listed(config)
    if names:
        return names
    import onnxep

    return [s.name for s in onnxep.get_all_providers()]


def unavailable_reason(name: str) -> str | None:
    """``None`` when provider ``name`` (or an alias) can run here, else why not."""
    from onnxep.plugins.registration import provider_unavailable_reason

    return provider_unavailable_reason(name)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "onnxep_provider" in metafunc.fixturenames:
        names = requested_providers(metafunc.config)
        metafunc.parametrize("onnxep_provider", names, ids=names, indirect=True)


@pytest.fixture
def onnxep_provider(request: pytest.FixtureRequest) -> Any:
    """One provider name from ``--onnxep-providers``; skips where it cannot run here."""
    from onnxep.plugins.registration import provider_status

    name = request.param
    status = provider_status(name)
    if status is not None and status.broken and name in _listed(request.config):
        pytest.fail(f"provider {name!r} is broken: {status.reason}", pytrace=False)
    why = unavailable_reason(name)
    if why is not None:
        pytest.skip(f"provider {name!r} is not available here: {why}")
    return name
