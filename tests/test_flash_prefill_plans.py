"""The tensor-core prefill's host side, checked without a GPU: tile geometry against the
hardware's limits for every head size it takes, its parameter block against the C layout,
and, where nvcc is installed, every instantiation compiled for sm_90 without spills."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from onnxep.providers_cuda.ops import _flash_cuda as src
from onnxep.providers_cuda.ops import _flash_prefill as fp

HEAD_SIZES = list(range(16, 257, 16))
#: Registers a thread may hold at 128 threads per block (the kernel's launch bound).
MAX_REGISTERS = 255


@pytest.mark.parametrize("d", HEAD_SIZES)
def test_geometry_fits_every_sm80_and_later_device(d):
    g = fp.geometry(d)
    assert g.bk % 16 == 0 and (not g.q_in_registers or g.bk >= fp.BQ)  # Q aliases V's buffer
    rows = g.bk + max(g.bk, fp.BQ) if g.q_in_registers else 2 * g.bk + fp.BQ
    assert g.smem == rows * (d + 8) * 2
    assert g.smem <= 99 * 1024  # sm_86/89's opt-in limit, the smallest of sm_80 and later
    assert fp.route("float16", d, d, 86, 99 * 1024).flash


def test_parameter_block_matches_the_c_layout(tmp_path):
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed here")
    p = src.FLASH
    lines = ["#include <stdio.h>", "#include <stddef.h>", p.source, "int main() {"]
    lines.append(f'  printf("size %zu\\n", sizeof({p.name}));')
    lines += [f'  printf("{n} %zu\\n", offsetof({p.name}, {n}));' for n, _ in p.fields]
    lines.append("  return 0;\n}")
    (tmp_path / "l.cpp").write_text("\n".join(lines))
    subprocess.run(["g++", "-o", str(tmp_path / "l"), str(tmp_path / "l.cpp")], check=True)
    out = subprocess.run([str(tmp_path / "l")], capture_output=True, text=True, check=True)
    got = dict(line.split() for line in out.stdout.splitlines())
    assert int(got["size"]) == p.dtype.itemsize
    for name, _ in p.fields:
        assert int(got[name]) == p.dtype.fields[name][1], name


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed here")
@pytest.mark.parametrize("ctype", ["__half", "bf16_t"])
def test_every_head_size_compiles_for_sm90_without_spills(ctype, tmp_path):
    """nvcc (NVRTC's front end) builds each instantiation; ptxas reports no spills and at
    most 255 registers a thread, so 128-thread blocks launch with no local memory."""
    names = []
    for d in HEAD_SIZES:
        g = fp.geometry(d)
        names.append(src.kernel_name(ctype, d, g.bk, g.q_in_registers))
    refs = "".join(f"  p[{i}] = (void*)&{n};\n" for i, n in enumerate(names))
    cu = tmp_path / "flash.cu"
    cu.write_text(f"{src.FLASH_SOURCE}\n__global__ void inst(void** p) {{\n{refs}}}\n")
    cmd = ["nvcc", "-std=c++17", "-arch=sm_90", "-cubin", "-Xptxas", "-v", "-o",
           str(tmp_path / "flash.cubin"), str(cu)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stderr[-4000:]
    reports = re.findall(
        r"Compiling entry function '(\w+)'.*?(\d+) bytes spill stores, (\d+) bytes spill loads"
        r".*?Used (\d+) registers",
        res.stderr,
        re.S,
    )
    flash = [r for r in reports if "flash_prefill" in r[0]]
    assert len(flash) == len(names), res.stderr[-4000:]
    for name, stores, loads, regs in flash:
        assert (int(stores), int(loads)) == (0, 0), f"{name} spills"
        assert int(regs) <= MAX_REGISTERS, name
