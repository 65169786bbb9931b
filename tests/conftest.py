"""Shared fixtures: tiny models, and installed-looking provider distributions."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest

# The emulated-kernel test modules' fixtures (the emulating provider, the op modules pointed at
# the emulator, each test with threads in order and reversed); a module may define its own.
from cuda_emulator import emulated, fiber_order, provider  # noqa: F401
from onnx import TensorProto, helper

import onnxep


def make_model(nodes, inputs, outputs, inits=(), opset=17, extra_opsets=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    opsets = [helper.make_opsetid("", opset), *[helper.make_opsetid(d, v) for d, v in extra_opsets]]
    return helper.make_model(graph, opset_imports=opsets)


def tensor(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


#: The exported models in tests/data, each with the sizes its symbolic dims take in tests.
EXPORTED_DIMS = {
    "llama_kv.onnx": {"batch": 1, "seq": 8, "past": 16},
    "llama_kv_opset23.onnx": {"batch": 2, "seq": 3, "past": 5},
    "hf_llama.onnx": {"batch": 2, "seq": 7},
    "hf_llama_kv.onnx": {"batch": 2, "seq": 3, "past": 4, "total": 7},
    "resnet_cnn.onnx": {"batch": 2},
}


def exported_feeds(sess, dims, rng, vocab=512):
    """Feeds for an exported model's inputs: symbolic dims from ``dims``, all-ones masks, zero
    token types, token ids below ``vocab``, standard normal floats."""
    feeds = {}
    for arg in sess.get_inputs():
        shape = [d if isinstance(d, int) else dims[d] for d in arg.shape]
        if arg.type == "tensor(int64)" and "mask" in arg.name:
            feeds[arg.name] = np.ones(shape, np.int64)
        elif arg.type == "tensor(int64)" and "type" in arg.name:
            feeds[arg.name] = np.zeros(shape, np.int64)
        elif arg.type == "tensor(int64)":
            feeds[arg.name] = rng.integers(0, vocab, shape).astype(np.int64)
        else:
            feeds[arg.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


@pytest.fixture
def add_relu_model():
    """x, y -> Add -> Relu -> Softmax: two ops a toy provider claims, one it does not."""
    return make_model(
        [
            helper.make_node("Add", ["x", "y"], ["s"], name="add"),
            helper.make_node("Relu", ["s"], ["r"], name="relu"),
            helper.make_node("Softmax", ["r"], ["out"], name="softmax", axis=-1),
        ],
        [tensor("x", ["N", 4]), tensor("y", ["N", 4])],
        [tensor("out", ["N", 4])],
    )


@pytest.fixture(params=[True, False], ids=["compiled", "numpy"])
def compiled(request, monkeypatch):
    """The CPU provider's compiled loops on, then its NumPy paths alone (``jit.ENABLED``)."""
    from onnxep.providers_cpu import jit

    if request.param and not jit.ENABLED:
        pytest.skip("numba not installed: only the NumPy path runs here")
    monkeypatch.setattr(jit, "ENABLED", request.param)
    return request.param


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def write_distribution(root: Path, dist: str, module: str, source: str, entry_points: dict):
    """Lay out ``module`` and a ``.dist-info`` under ``root``, as pip would install them."""
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist}-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
    lines = ["[onnxep.providers]"] + [f"{k} = {v}" for k, v in entry_points.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    (info / "RECORD").write_text("")


TOY_PROVIDER = '''
import numpy as np
from onnxep.providers import Provider, ProviderInfo, KernelSpec, hookimpl, kernel

STATS = {"to_host": 0, "from_host": 0}


class ToyProvider(Provider):
    """Runs Add and Relu on float32 'toy device' arrays (NumPy copies, counted)."""

    def __init__(self, options):
        super().__init__("toy", options, device="toy", xp=np)

    def to_host(self, x):
        STATS["to_host"] += 1
        return np.array(x, copy=True)

    def from_host(self, x):
        STATS["from_host"] += 1
        return np.array(x, copy=True)


@kernel("Add", since=7, dtypes={0: ["float"], 1: ["float"]})
def add(node, xp):
    return lambda a, b: (xp.add(a, b),)


@kernel("Relu", since=6, dtypes=["float"])
def relu(node, xp):
    return lambda x: (xp.maximum(x, 0),)


@kernel("Reshape", since=14, host_inputs=(1,))
def reshape(node, xp):
    return lambda x, shape: (xp.reshape(x, tuple(int(d) for d in shape)),)


@kernel("Concat", since=13)
def concat(node, xp):
    axis = node.attr("axis")
    return lambda *xs: (xp.concat(xs, axis=axis),)


class Plugin:
    @hookimpl
    def onnxep_provider_info(self):
        return ProviderInfo(name="toy", aliases=("ToyExecutionProvider",), device="toy",
                            version="0.1.0")

    @hookimpl
    def onnxep_create_provider(self, options):
        return ToyProvider(options)

    @hookimpl
    def onnxep_kernels(self, provider):
        if provider.name == "toy":
            return [*add.__onnxep_kernels__, *relu.__onnxep_kernels__,
                    *reshape.__onnxep_kernels__, *concat.__onnxep_kernels__]


plugin = Plugin()
'''

BROKEN_PROVIDER = """
raise ImportError("toy_broken needs libfoo, which is not installed")
"""


@pytest.fixture
def toy_dist(tmp_path, monkeypatch):
    """A real distribution on sys.path offering provider 'toy', plus one whose import fails."""
    root = tmp_path / "site"
    root.mkdir()
    write_distribution(root, "onnxep_toy", "onnxep_toy", TOY_PROVIDER, {"toy": "onnxep_toy:plugin"})
    write_distribution(
        root, "onnxep_broken", "onnxep_broken", BROKEN_PROVIDER, {"broken": "onnxep_broken:plugin"}
    )
    monkeypatch.syspath_prepend(str(root))
    onnxep.rediscover()
    yield root
    for mod in ("onnxep_toy", "onnxep_broken"):
        sys.modules.pop(mod, None)
    onnxep.rediscover()


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def _why_no_gpu() -> str | None:
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CuPy built for another CUDA
        return f"CuPy is not importable here ({type(exc).__name__}: {exc})"
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            return "no CUDA device is visible"
    except Exception as exc:
        return f"no usable CUDA device or driver ({type(exc).__name__}: {exc})"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests under tests/cuda need a GPU: marked ``cuda``, and skipped with the reason elsewhere.

    This lives here rather than in a tests/cuda/conftest.py: a second module named
    ``conftest`` would shadow this one for the tests that import its helpers.
    """
    gpu = [i for i in items if "tests/cuda/" in str(i.fspath).replace("\\", "/")]
    if not gpu:
        return
    why = _why_no_gpu()
    for item in gpu:
        item.add_marker(pytest.mark.cuda)
        if why is not None:
            item.add_marker(pytest.mark.skip(reason=f"needs a CUDA GPU: {why}"))
