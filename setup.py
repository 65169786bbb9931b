"""Copies the repository's plugins.toml into the built package, so a wheel carries the default."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPy(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "onnxep" / "plugins.toml"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / "plugins.toml", target)


setup(cmdclass={"build_py": BuildPy})
