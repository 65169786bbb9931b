"""What ``import onnxep`` and a first session load: tooling never, heavy modules on need."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

DATA = Path(__file__).parent / "data"


def _loaded(code: str) -> set[str]:
    probe = textwrap.dedent(code) + "\nimport sys\nprint(' '.join(sorted(sys.modules)))\n"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def _under(mods: set[str], *packages: str) -> set[str]:
    return {m for m in mods if any(m == p or m.startswith(p + ".") for p in packages)}


def test_import_onnxep_loads_no_tooling_and_no_onnx():
    mods = _loaded("import onnxep")
    assert not _under(mods, "onnxep.tools", "onnx", "onnx_ir", "onnxscript", "ml_dtypes", "tqdm")
    assert "onnxep.errors" in mods


def test_a_cpu_session_loads_no_tooling():
    mods = _loaded(
        f"""
        import numpy as np, onnxep
        s = onnxep.InferenceSession({str(DATA / "resnet_cnn.onnx")!r}, providers=["cpu"])
        x = s.get_inputs()[0]
        s.run(None, {{x.name: np.zeros([d if isinstance(d, int) else 1 for d in x.shape],
                                       np.float32)}})
        assert s.get_providers() == ["cpu"]
        """
    )
    assert not _under(mods, "onnxep.tools", "tqdm", "cupy")
    assert "onnxep.session" in mods


def test_public_names_resolve_lazily_and_are_listed():
    import onnxep

    for name in onnxep.__all__:
        assert getattr(onnxep, name) is not None, name
    assert set(onnxep.__all__) <= set(dir(onnxep))
    assert onnxep.bench.__module__ == "onnxep.tools.benchmark.api"
