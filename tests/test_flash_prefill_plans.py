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
#: Spill bytes (stores, loads) an instantiation may have: see the nvcc test.
SPILL_SLACK = 8


def _shapes(d):
    return [fp.geometry(d, mt) for mt in ((1, 2) if d <= fp.MAX_TWO_TILE_HEAD else (1,))]


@pytest.mark.parametrize("d", HEAD_SIZES)
def test_geometry_fits_every_sm80_and_later_device(d):
    for g in _shapes(d):
        assert g.bk % 16 == 0 and g.bq == 64 * g.m_tiles
        alias = g.q_in_registers and g.bq <= g.bk  # Q's tile in V's buffer
        assert g.smem == (2 * g.bk + (0 if alias else g.bq)) * (d + 8) * 2
        assert g.smem <= 99 * 1024  # sm_86/89's opt-in limit, the smallest of sm_80 and later
    assert fp.route("float16", d, d, 86, 99 * 1024).flash


def test_two_tiles_per_warp_only_where_the_blocks_still_fill_the_device():
    # 2000 tokens of 14 heads: 16 double tiles x 14 = 224 blocks >= 132 SMs
    assert fp.m_tiles(64, 1, 14, 2000, 132) == 2
    assert fp.m_tiles(64, 1, 14, 512, 132) == 1  # 4 x 14 = 56 blocks
    assert fp.m_tiles(128, 4, 32, 8000, 132) == 1  # head size 128: registers
    with pytest.raises(ValueError, match="2 m16 tiles per warp at head size 80"):
        fp.geometry(80, 2)


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
    """nvcc (NVRTC's front end) builds each instantiation within 255 registers a thread,
    and ptxas spills at most a word or two: with CUDA 13.0, bfloat16 at head size 144
    spills 4 bytes at 168 registers (a ptxas choice, not a shortage); every other
    instantiation spills nothing. More would mean the fragments outgrew the registers."""
    names = [
        src.kernel_name(ctype, d, g.bk, g.q_in_registers, g.m_tiles)
        for d in HEAD_SIZES
        for g in _shapes(d)
    ]
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
        assert int(stores) <= SPILL_SLACK and int(loads) <= SPILL_SLACK, f"{name} spills"
        assert int(regs) <= MAX_REGISTERS, name
