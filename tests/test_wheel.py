"""A wheel built from the repository works in a fresh virtual environment outside it."""

from __future__ import annotations

import pkgutil
import site
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _all_modules() -> list[str]:
    import onnxep

    names = ["onnxep"]
    for info in pkgutil.walk_packages(onnxep.__path__, "onnxep."):
        names.append(info.name)
    return names


def test_every_source_module_is_in_a_listed_package():
    import tomllib

    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    dirs = {
        "onnxep": "core",
        "onnxep.providers": "providers",
        "onnxep.providers_cpu": "providers_cpu",
        "onnxep.providers_cuda": "providers_cuda",
    }
    for pkg, folder in dirs.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            name = ".".join([pkg, *rel.parts]) if rel.parts else pkg
            assert name in listed, f"package {name} ({init.parent}) is missing from pyproject.toml"


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wheel")
    wheels = tmp / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = wheels.glob("onnxep-*.whl")
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    target = Path(
        subprocess.run(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    # The runtime dependencies come from this environment's site-packages, listed as a
    # plain path: its .pth files (our editable install among them) are not processed.
    deps = [p for p in site.getsitepackages() if Path(p).exists()]
    (target / "zz_deps.pth").write_text("\n".join(deps) + "\n")
    return py, tmp


def _run(py, code, cwd):
    return subprocess.run(
        [str(py), "-c", code], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_wheel_imports_every_module_without_cupy(fresh_env):
    py, tmp = fresh_env
    mods = _all_modules()
    code = (
        "import importlib, importlib.util, onnxep, sys\n"
        f"mods = {mods!r}\n"
        "for m in mods: importlib.import_module(m)\n"
        "assert 'site-packages' in onnxep.__file__ or 'lib' in onnxep.__file__, onnxep.__file__\n"
        "assert importlib.util.find_spec('cupy') is None\n"
        "print(onnxep.__file__)\n"
    )
    res = _run(py, code, tmp)
    assert res.returncode == 0, res.stderr
    assert str(ROOT) not in res.stdout


def test_wheel_discovers_providers_and_reads_its_plugins_toml(fresh_env):
    py, tmp = fresh_env
    code = (
        "import onnxep\n"
        "from onnxep.plugins.config import default_config_path\n"
        "p = default_config_path(); print(p)\n"
        "st = {s.name: s for s in onnxep.get_all_providers()}\n"
        "assert st['cpu'].available, st\n"
        "assert not st['cuda'].available and 'CuPy' in st['cuda'].reason, st['cuda']\n"
        "import numpy as np\n"
        "from onnxep.tools.cli import bundled_model\n"
        "s = onnxep.InferenceSession(str(bundled_model()))\n"
        "out = s.run(None, {'image': np.zeros((1, 3, 32, 32), np.float32)})[0]\n"
        "assert out.shape == (1, 10)\n"
    )
    res = _run(py, code, tmp)
    assert res.returncode == 0, res.stderr
    assert str(ROOT) not in res.stdout.splitlines()[0]
