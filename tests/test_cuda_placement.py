"""Where the CUDA provider's placement puts nodes and copies, checked without a GPU.

tests/cuda/cuda_sim.py declines exactly what the CUDA provider declines by op
and dtype, on a device of its own; placement is fixed at session creation, so
the copies it shows are the copies a GPU run makes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import onnxep

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"


@pytest.fixture(scope="module")
def sim():
    sys.path.insert(0, str(HERE / "cuda"))
    try:
        import cuda_sim
    finally:
        sys.path.remove(str(HERE / "cuda"))
    cuda_sim.register()
    return cuda_sim.NAME


@pytest.mark.parametrize(
    "name", ["llama_kv.onnx", "llama_kv_opset23.onnx", "hf_llama_kv.onnx", "resnet_cnn.onnx"]
)
def test_device_reads_only_the_outputs(sim, name):
    """Shape values a device kernel also reads are computed on the host and copied up,
    never computed on the device and read back: a run reads exactly its outputs."""
    sess = onnxep.InferenceSession(str(DATA / name), providers=[sim, "cpu"])
    rep = sess.placement()
    assert not [n for n in rep if n.role == "compute" and n.provider != sim]
    reads = [c for c in rep.copies if c.dst == "cpu" and c.src != "cpu"]
    assert [c.consumer for c in reads] == ["<graph output>"] * len(sess.get_outputs())
    assert rep.device_to_host_reads == len(sess.get_outputs())
