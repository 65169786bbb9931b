"""The CPU provider's note on OpenBLAS's kernels (providers_cpu/openblas_core.py)."""

from __future__ import annotations

import numpy as np
import pytest

from onnxep.providers_cpu.openblas_core import AVX512_FLAGS, advice, family_of, openblas_notes

ZEN5 = AVX512_FLAGS | {"avx2", "fma", "avx512_vnni"}
AVX2_ONLY = frozenset({"avx", "avx2", "fma"})


@pytest.mark.parametrize(
    ("core", "flags", "forced", "says"),
    [
        ("Haswell", ZEN5, "Haswell", "OPENBLAS_CORETYPE=Haswell is set"),
        ("Haswell", ZEN5, None, "OpenBLAS did not detect AVX-512"),
        ("Prescott", ZEN5, None, "runs its Prescott"),
        ("SkylakeX", ZEN5, None, None),
        ("Cooperlake", ZEN5, None, None),
        ("Haswell", AVX2_ONLY, None, None),  # no AVX-512: Haswell is right
        ("Haswell", AVX512_FLAGS - {"avx512vl"}, None, None),  # SkylakeX kernels need VL
        ("Haswell", None, None, None),  # flags unknown (not Linux): say nothing
        ("", ZEN5, None, None),
    ],
)
def test_advice(core, flags, forced, says):
    got = advice(core, flags, forced)
    if says is None:
        assert got is None
    else:
        assert says in got and "OPENBLAS_CORETYPE=SkylakeX" in got


def test_notes_reach_the_session_report(tmp_path):
    import onnx
    from onnx import helper as h

    import onnxep

    g = h.make_graph(
        [h.make_node("MatMul", ["a", "b"], ["y"])],
        "g",
        [h.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [4, 4]) for n in "ab"],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 4])],
    )
    path = tmp_path / "m.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    sess = onnxep.InferenceSession(str(path), providers=["cpu"])
    a = np.eye(4, dtype=np.float32)
    np.testing.assert_array_equal(sess.run(None, {"a": a, "b": a})[0], a)
    notes = sess.placement().provider_notes["cpu"]
    assert notes[0].startswith("BLAS threads:")
    # This machine's own situation, whatever it is: every note is in the report (and
    # which GEMMs run at the session's thread count, where they are onnxep's own:
    # conv_gemm.py, weight_gemm.py).
    from onnxep.providers_cpu.ops import conv_direct, conv_gemm, weight_gemm

    n = int(notes[0].split(":")[1].split()[0])
    gemms = [
        *conv_gemm.session_notes(n),
        *conv_direct.session_notes(),
        *weight_gemm.session_notes(n),
    ]
    assert "split threads poll" in notes[1]  # session.intra_op.allow_spinning's default
    assert notes[2:] == [*openblas_notes(), *gemms]


@pytest.mark.parametrize(
    "text,want",
    [
        (
            "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n",
            ("AuthenticAMD", 25),
        ),
        (
            "processor\t: 0\ncpu family\t: 6\nvendor_id\t: GenuineIntel\n\nprocessor\t: 1\n",
            ("GenuineIntel", 6),
        ),
        ("processor\t: 0\nvendor_id\t: AuthenticAMD\n\ncpu family\t: 25\n", None),  # another CPU's
        ("vendor_id\t: AuthenticAMD\ncpu family\t: ?\n", None),
        ("", None),
    ],
)
def test_cpu_family_of_cpuinfo(text, want):
    assert family_of(text.splitlines(keepends=True)) == want
