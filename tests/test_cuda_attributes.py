"""Every ``self.name`` the CUDA provider's classes read is one they (or the SDK base they
extend) define: checked from the source, so a renamed attribute fails here, in CI, and not
first on the GPU machine (a merge once left ``self._cupy`` reads after the rename to
``self.cupy``)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import onnxep.providers as sdk

ROOT = Path(__file__).resolve().parents[1] / "providers_cuda"
SOURCES = sorted(ROOT.rglob("*.py"))


def _defined(cls: ast.ClassDef) -> set[str]:
    names = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    for node in ast.walk(cls):
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for t in targets:
            for sub in ast.walk(t):
                if isinstance(sub, ast.Attribute) and _is_self(sub.value):
                    names.add(sub.attr)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr":
            return {"*"}  # attributes set by name: nothing to check
    return names


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _classes():
    for path in SOURCES:
        tree = ast.parse(path.read_text(), str(path))
        local = {c.name: c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)}
        for cls in local.values():
            bases = [
                b.id if isinstance(b, ast.Name) else getattr(b, "attr", "?") for b in cls.bases
            ]
            yield path, cls, bases, local


CASES = [
    pytest.param(path, cls, bases, local, id=f"{path.relative_to(ROOT)}::{cls.name}")
    for path, cls, bases, local in _classes()
]


@pytest.mark.parametrize(("path", "cls", "bases", "local"), CASES)
def test_every_attribute_read_is_defined(path, cls, bases, local):
    defined = _defined(cls)
    for base in bases:
        if base in local:
            defined |= _defined(local[base])
        elif hasattr(sdk, base):
            defined |= set(dir(getattr(sdk, base)))
        elif base not in ("object", "Generic", "Protocol", "NamedTuple"):
            pytest.skip(f"{cls.name} extends {base}, defined elsewhere")
    if "*" in defined:
        return
    read = {
        (node.attr, node.lineno)
        for node in ast.walk(cls)
        if isinstance(node, ast.Attribute) and _is_self(node.value)
        and isinstance(node.ctx, ast.Load)
    }  # fmt: skip
    missing = sorted(
        (name, line) for name, line in read if name not in defined and name not in dir(object)
        and name != "__dict__"
    )  # fmt: skip
    assert not missing, f"{path.name}: {cls.name} reads attributes it never defines: {missing}"
