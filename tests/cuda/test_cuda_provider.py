"""The CUDA provider itself: placement, reads per run, options, streams, pools, declines."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from _models import BF16, F32, I64, single, unary_pair
from onnx import helper

import onnxep
from onnxep.errors import FallbackError, ProviderError

cupy = pytest.importorskip("cupy", reason="the CUDA tests need CuPy and a GPU")


def _feeds(n=3, seed=0):
    return {"x": np.random.default_rng(seed).standard_normal(n).astype(np.float32)}


def _expected(x):
    return [np.maximum(x, 0) + 1, -x]


def test_listed_available_and_aliased():
    assert "cuda" in onnxep.get_available_providers()
    sess = onnxep.InferenceSession(unary_pair(), providers=["CUDAExecutionProvider"])
    assert sess.get_providers() == ["cuda", "cpu"]
    assert {n.provider for n in sess.placement() if n.role == "compute"} == {"cuda"}


def test_reads_per_run_equal_the_outputs():
    sess = onnxep.InferenceSession(unary_pair(), providers=["cuda"])
    cuda = sess.providers[0]
    f = _feeds()
    sess.run(None, f)
    before = cuda.transfer_counts()
    got = sess.run(None, f)
    after = cuda.transfer_counts()
    assert after["device_to_host"] - before["device_to_host"] == 2
    assert after["host_to_device"] - before["host_to_device"] == 1  # x; the constant stays
    assert sess.placement().device_to_host_reads == 2
    for g, w in zip(got, _expected(f["x"])):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_shape_inputs_are_computed_on_the_host():
    # Reshape's target shape comes from Shape -> Concat on the device input: that math
    # moves to the host, so the only device-to-host read is the output.
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("ReduceProd", ["s"], ["n"], keepdims=1),
        helper.make_node("Reshape", ["x", "n"], ["y"]),
        helper.make_node("Relu", ["y"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", F32, ["a", "b"])],
        [helper.make_tensor_value_info("out", F32, None)],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = onnxep.InferenceSession(m, providers=["cuda"])
    x = np.arange(-6, 6, dtype=np.float32).reshape(3, 4)
    cuda = sess.providers[0]
    sess.run(None, {"x": x})
    before = cuda.transfer_counts()["device_to_host"]
    (y,) = sess.run(None, {"x": x})
    assert cuda.transfer_counts()["device_to_host"] - before == 1
    np.testing.assert_array_equal(y, np.maximum(x.reshape(-1), 0))


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"device_id": 99}, "device_id 99 is out of range"),
        ({"device_id": -1}, "non-negative"),
        ({"gpu_mem_limit": "lots"}, "is not a size"),
        ({"colour": "blue"}, "unknown CUDA provider option"),
        ({"stream": 3.5}, "stream must be"),
    ],
)
def test_bad_options_are_clear(options, match):
    with pytest.raises(ProviderError, match=match):
        onnxep.InferenceSession(unary_pair(), providers=[("cuda", options)])


def test_onnxruntime_only_options_are_accepted_and_listed():
    sess = onnxep.InferenceSession(
        unary_pair(), providers=[("cuda", {"cudnn_conv_algo_search": "EXHAUSTIVE"})]
    )
    assert sess.providers[0].describe()["ignored_options"] == ["cudnn_conv_algo_search"]


def test_gpu_mem_limit_takes_sizes():
    sess = onnxep.InferenceSession(unary_pair(), providers=[("cuda", {"gpu_mem_limit": "64MiB"})])
    assert sess.providers[0].cuda_options.gpu_mem_limit == 64 << 20


def test_two_sessions_on_device_ids_keep_their_own_stream_and_pool():
    """Device 0 twice: each session has its own stream and pool; with several GPUs the
    same code runs each session on its own device_id."""
    ndev = cupy.cuda.runtime.getDeviceCount()
    ids = [0, 1 if ndev > 1 else 0]
    sessions = [
        onnxep.InferenceSession(unary_pair(shape=["n"]), providers=[("cuda", {"device_id": i})])
        for i in ids
    ]
    p0, p1 = (s.providers[0] for s in sessions)
    assert p0.stream.ptr != p1.stream.ptr and p0.pool is not p1.pool
    results: dict[int, list] = {}

    def work(k):
        f = _feeds(1000, seed=k)
        for _ in range(20):
            results[k] = (sessions[k].run(None, f), f)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(2):
        got, f = results[k]
        for g, w in zip(got, _expected(f["x"])):
            np.testing.assert_allclose(g, w, rtol=1e-6)


def test_external_cupy_stream_and_raw_handle():
    s = cupy.cuda.Stream(non_blocking=True)
    a = onnxep.InferenceSession(unary_pair(), providers=[("cuda", {"stream": s})])
    b = onnxep.InferenceSession(unary_pair(), providers=[("cuda", {"stream": s.ptr})])
    assert a.providers[0].stream is s and b.providers[0].stream.ptr == s.ptr
    f = _feeds()
    for sess in (a, b):
        for g, w in zip(sess.run(None, f), _expected(f["x"])):
            np.testing.assert_allclose(g, w, rtol=1e-6)


def test_torch_stream_option():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    ts = torch.cuda.Stream()
    sess = onnxep.InferenceSession(unary_pair(), providers=[("cuda", {"stream": ts})])
    assert sess.providers[0].stream.ptr == ts.cuda_stream
    f = _feeds()
    np.testing.assert_allclose(sess.run(None, f)[1], -f["x"])


def test_declines_name_the_reason():
    cast = single("Cast", [("x", F32, [3])], [("y", BF16, [3])], {"to": BF16})
    sess = onnxep.InferenceSession(cast, providers=["cuda", "cpu"])
    (node,) = list(sess.placement())
    assert node.provider == "cpu"
    assert "bfloat16 is declined for now" in dict(node.declined)["cuda"]
    rnd = single("RandomNormalLike", [("x", F32, [3])], [("y", F32, [3])], {"seed": 1.0})
    (node,) = list(onnxep.InferenceSession(rnd, providers=["cuda", "cpu"]).placement())
    assert "random" in dict(node.declined)["cuda"]


def test_disable_fallback_names_the_declined_node():
    cast = single("Cast", [("x", F32, [3])], [("y", BF16, [3])], {"to": BF16})
    with pytest.raises(FallbackError, match="bfloat16"):
        onnxep.InferenceSession(
            cast, onnxep.SessionOptions(disable_fallback=True), providers=["cuda"]
        )


def test_capture_flags():
    sess = onnxep.InferenceSession(unary_pair(), providers=["cuda"])
    reg = sess.providers[0].registry
    assert reg.lookup("", "MatMul", 13).capture_safe
    assert reg.lookup("", "Add", 14).capture_safe
    einsum = reg.lookup("", "Einsum", 12)
    assert not einsum.capture_safe and "capture" in einsum.capture_note
    assert not reg.lookup("", "NonZero", 13).capture_safe


def test_nvrtc_kernels_compile_once_per_process():
    from onnxep.providers_cuda import nvrtc

    onnxep.InferenceSession(unary_pair(), providers=["cuda"])
    n = nvrtc.cached_count()
    onnxep.InferenceSession(unary_pair(), providers=["cuda"])
    assert nvrtc.cached_count() == n


def test_int64_and_float16_values_run_on_the_device():
    m = single("Add", [("a", I64, [4]), ("b", I64, [4])], [("c", I64, [4])])
    sess = onnxep.InferenceSession(m, onnxep.SessionOptions(disable_fallback=True), ["cuda"])
    a = np.arange(4, dtype=np.int64)
    np.testing.assert_array_equal(sess.run(None, {"a": a, "b": a})[0], 2 * a)


def test_transfers_leave_sequences_and_empty_optionals_on_the_host():
    """docs/providers.md: from_host/to_host also receive lists (sequences) and None."""
    relu = single("Relu", [("x", F32, [2])], [("y", F32, [2])])
    prov = onnxep.InferenceSession(relu, providers=["cuda"]).providers[0]
    seq = [np.ones(2, np.float32), np.zeros(3, np.float32)]
    assert prov.from_host(seq) is seq
    assert prov.from_host(None) is None
    assert prov.to_host(None) is None
