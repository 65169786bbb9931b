"""One session run from many threads gets the same outputs as serial runs."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import onnxep

DATA = Path(__file__).parent / "data"


def test_eight_threads_match_serial():
    sess = onnxep.InferenceSession(str(DATA / "llama_kv.onnx"), providers=["cpu"])
    rng = np.random.default_rng(1)
    feeds = []
    for i in range(16):
        seq, past = 1 + i % 4, 2 + i % 5
        f = {"input_ids": rng.integers(0, 512, (1, seq)).astype(np.int64)}
        for arg in sess.get_inputs()[1:]:
            f[arg.name] = rng.standard_normal((1, 2, past, 64)).astype(np.float32)
        feeds.append(f)
    serial = [sess.run(None, f) for f in feeds]
    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in range(3):
            parallel = list(pool.map(lambda f: sess.run(None, f), feeds))
            for s, p in zip(serial, parallel):
                for a, b in zip(s, p):
                    np.testing.assert_array_equal(a, b)


def test_eight_threads_on_the_cnn_match_serial():
    # Conv keeps per-thread scratch buffers and tunes itself on first use per shape,
    # choosing only among variants with the same bits: results are exact.
    sess = onnxep.InferenceSession(str(DATA / "resnet_cnn.onnx"), providers=["cpu"])
    rng = np.random.default_rng(2)
    feeds = [
        {"image": rng.standard_normal((1 + i % 3, 3, 64, 64)).astype(np.float32)} for i in range(12)
    ]
    serial = [sess.run(None, f)[0] for f in feeds]
    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in range(2):
            for s, p in zip(serial, pool.map(lambda f: sess.run(None, f)[0], feeds)):
                np.testing.assert_array_equal(p, s)


def _cnn_feeds():
    rng = np.random.default_rng(3)
    return [
        {"image": rng.standard_normal((1 + i % 2, 3, 64, 64)).astype(np.float32)} for i in range(4)
    ]


def _bits(sess, feed):
    return [o.tobytes() for o in sess.run(None, feed)]


def test_concurrent_first_runs_of_a_cold_session_are_bit_identical_to_serial_runs():
    # Every first-use choice (Conv's GEMM split and im2col layout) is made while
    # eight threads race into a fresh session; each thread's outputs, and the
    # session's later runs, must carry exactly the bits of another fresh session
    # run serially.
    path = str(DATA / "resnet_cnn.onnx")
    feeds = _cnn_feeds()
    serial = onnxep.InferenceSession(path, providers=["cpu"])
    want = [_bits(serial, f) for f in feeds]
    cold = onnxep.InferenceSession(path, providers=["cpu"])
    threads, runs = 8, 2
    barrier = threading.Barrier(threads)

    def work(t):
        barrier.wait()
        got = []
        for r in range(runs):
            for k in range(len(feeds)):
                k = (k + t + r) % len(feeds)  # threads start on different shapes
                got.append((k, _bits(cold, feeds[k])))
        return got

    with ThreadPoolExecutor(max_workers=threads) as pool:
        results = list(pool.map(work, range(threads)))
    differ = [(t, k) for t, got in enumerate(results) for k, outs in got if outs != want[k]]
    assert not differ, f"{len(differ)} of {threads * runs * len(feeds)} runs differ in bits"
    assert [_bits(cold, f) for f in feeds] == want


def _blas_threads_now() -> int:
    from threadpoolctl import threadpool_info

    return max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")


def _matmul_model():
    from conftest import make_model, tensor
    from onnx import helper

    return make_model(
        [helper.make_node("MatMul", ["a", "b"], ["y"])],
        [tensor("a", [64, 64]), tensor("b", [64, 64])],
        [tensor("y", [64, 64])],
    )


def test_intra_op_num_threads_limits_blas_during_runs_only():
    """SessionOptions(intra_op_num_threads=1) is honoured: BLAS runs one thread inside a run,
    and the process's own setting is back after it."""
    pytest.importorskip("threadpoolctl")
    seen = []
    before = _blas_threads_now()
    opts = onnxep.SessionOptions(intra_op_num_threads=1)
    sess = onnxep.InferenceSession(_matmul_model(), opts, providers=["cpu"])
    assert sess.get_provider_options()["cpu"]["intra_op_num_threads"] == 1
    cpu = sess.providers[0]
    with cpu.run_context():
        seen.append(_blas_threads_now())
    a = np.ones((64, 64), np.float32)
    np.testing.assert_array_equal(sess.run(None, {"a": a, "b": a})[0], a @ a)
    assert seen == [1]
    assert _blas_threads_now() == before


def test_sessions_with_different_thread_counts_run_concurrently_and_correctly():
    pytest.importorskip("threadpoolctl")
    one = onnxep.InferenceSession(
        _matmul_model(), onnxep.SessionOptions(intra_op_num_threads=1), providers=["cpu"]
    )
    two = onnxep.InferenceSession(
        _matmul_model(), onnxep.SessionOptions(intra_op_num_threads=2), providers=["cpu"]
    )
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 64)).astype(np.float32)

    def job(i):
        sess = one if i % 2 else two
        return sess.run(None, {"a": a, "b": a})[0]

    with ThreadPoolExecutor(4) as pool:
        for y in pool.map(job, range(40)):
            np.testing.assert_allclose(y, a @ a, rtol=1e-5, atol=1e-5)


def test_bad_thread_count_is_one_sentence():
    from onnxep.errors import ProviderError

    bad = onnxep.SessionOptions(intra_op_num_threads=-2)
    with pytest.raises(ProviderError, match="'cpu' failed to start.*intra_op_num_threads must be"):
        onnxep.InferenceSession(_matmul_model(), bad, providers=["cpu"])


def _cpu_note(sess) -> str:
    # the thread count's note comes first; an OpenBLAS kernel note may follow (openblas_core)
    note = sess.placement().provider_notes["cpu"][0]
    assert note.startswith("BLAS threads:")
    return note


def _gemm_model(m: int, k: int, n: int):
    from conftest import make_model, tensor
    from onnx import helper, numpy_helper

    w = numpy_helper.from_array(np.full((k, n), 0.5, np.float32), "w")
    return make_model(
        [helper.make_node("MatMul", ["a", "w"], ["y"])],
        [tensor("a", [m, k])],
        [tensor("y", [m, n])],
        inits=[w],
    )


def test_default_threads_are_one_for_a_small_model_and_every_core_for_a_large_one():
    from onnxep.providers_cpu.thread_policy import MIN_SPLIT_MACS
    from onnxep.providers_cpu.threads import cpu_count

    # the small ResNet at batch 1 (its batch dim is free: counted as 1)
    small = onnxep.InferenceSession(str(DATA / "resnet_cnn.onnx"), providers=["cpu"])
    assert small.providers[0].blas_thread_count == 1
    note = _cpu_note(small)
    assert note.startswith(f"BLAS threads: 1 of {cpu_count()} cores, chosen for the session")
    assert "node_FusedConv" in note and "under the" in note
    # a product of 4M multiply-adds and more: every core
    large = onnxep.InferenceSession(_gemm_model(256, 256, 256), providers=["cpu"])
    assert 256**3 >= MIN_SPLIT_MACS
    assert large.providers[0].blas_thread_count == cpu_count()
    assert "16.8M multiply-adds, at least the" in _cpu_note(large)
    # the chosen count is what the runs get
    seen = []
    with large.providers[0].run_context():
        seen.append(_blas_threads_now())
    with small.providers[0].run_context():
        seen.append(_blas_threads_now())
    assert seen == [cpu_count(), 1]
    a = np.ones((256, 256), np.float32)
    np.testing.assert_array_equal(large.run(None, {"a": a})[0], a @ np.full((256, 256), 0.5, "f"))


def test_free_dims_overridden_count_at_their_size():
    opts = onnxep.SessionOptions()
    # the free batch dim of the small ResNet at 64 images: a product past the limit
    opts.add_free_dimension_override_by_name("batch", 64)
    sess = onnxep.InferenceSession(str(DATA / "resnet_cnn.onnx"), opts, providers=["cpu"])
    from onnxep.providers_cpu.threads import cpu_count

    assert sess.providers[0].blas_thread_count == cpu_count()


def test_explicit_thread_count_wins_over_the_policy_and_is_reported():
    for n in (1, 3):
        opts = onnxep.SessionOptions(intra_op_num_threads=n)
        sess = onnxep.InferenceSession(_gemm_model(256, 256, 256), opts, providers=["cpu"])
        assert sess.providers[0].blas_thread_count == n
        assert _cpu_note(sess) == f"BLAS threads: {n} (intra_op_num_threads={n})"
        assert f"cpu: BLAS threads: {n}" in sess.placement().format()
    small = onnxep.InferenceSession(
        _matmul_model(), onnxep.SessionOptions(intra_op_num_threads=2), providers=["cpu"]
    )
    assert small.providers[0].blas_thread_count == 2


def test_a_folded_constant_product_does_not_count():
    from conftest import make_model, tensor
    from onnx import helper, numpy_helper

    big = numpy_helper.from_array(np.ones((256, 256), np.float32), "big")
    model = make_model(
        [
            helper.make_node("MatMul", ["big", "big"], ["w"]),  # folded at creation
            helper.make_node("Add", ["x", "w"], ["y"]),
        ],
        [tensor("x", [256, 256])],
        [tensor("y", [256, 256])],
        inits=[big],
    )
    sess = onnxep.InferenceSession(model, providers=["cpu"])
    # no product left: the process's own count, nothing to set per run
    assert sess.providers[0].blas_thread_count == _blas_threads_now()
    assert "the process's count" in _cpu_note(sess)


def test_a_worker_thread_gets_the_count_after_a_run_on_the_main_thread():
    # threadpoolctl lets only its "controlling" thread (the first live one to set a count)
    # change OpenBLAS's; a run from a worker after one from the main thread kept two
    # threads, and other bits than the serial runs.
    sess = onnxep.InferenceSession(
        _matmul_model(), onnxep.SessionOptions(intra_op_num_threads=1), providers=["cpu"]
    )
    a = np.ones((64, 64), np.float32)
    sess.run(None, {"a": a, "b": a})  # the main thread sets and restores the count
    seen = []

    def work():
        with sess.providers[0].run_context():
            seen.append(_blas_threads_now())

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen == [1]


def test_parallel_rows_does_not_wait_for_a_helper_that_has_not_started():
    """On a loaded machine the pool's helper may start long after the caller has done
    every chunk itself; the caller returns then, without waiting for it."""
    import time

    from onnxep.providers_cpu.ops import nn_cpu
    from onnxep.providers_cpu.threads import blas_threads

    release = threading.Event()
    nn_cpu._thread_pool().submit(release.wait, 10)  # noqa: SLF001  (the pool's one helper, busy)
    done = np.zeros(64, np.int64)

    def fn(r0, r1):
        done[r0:r1] += 1

    try:
        t0 = time.perf_counter()
        with blas_threads(2):
            nn_cpu.parallel_rows(64, 1 << 30, fn)
        took = time.perf_counter() - t0
    finally:
        release.set()
    assert took < 5 and (done == 1).all()


def test_parallel_rows_raises_a_chunks_error():
    from onnxep.providers_cpu.ops import nn_cpu
    from onnxep.providers_cpu.threads import blas_threads

    def fn(r0, r1):
        if r0 <= 40 < r1:
            raise ValueError("chunk 40")

    with blas_threads(2), pytest.raises(ValueError, match="chunk 40"):
        nn_cpu.parallel_rows(64, 1 << 30, fn)


def _conv_model(c: int, m: int, hw: int):
    from conftest import make_model, tensor
    from onnx import helper, numpy_helper

    w = numpy_helper.from_array(np.full((m, c, 1, 1), 0.01, np.float32), "w")
    return make_model(
        [helper.make_node("Conv", ["x", "w"], ["y"])],
        [tensor("x", [1, c, hw, hw])],
        [tensor("y", [1, m, hw, hw])],
        inits=[w],
    )


def test_convolutions_split_from_the_bound_the_conv_kernels_split_at():
    """A convolution gets every core only where the provider's conv kernels would split
    it: under that bound a second thread split none of them and only moved pointwise
    convs to the compiled GEMM, run on one thread. Other products keep BLAS's bound."""
    from onnxep.providers_cpu.ops import nn_cpu
    from onnxep.providers_cpu.thread_policy import CONV_SPLIT_MACS, MIN_SPLIT_MACS, choose
    from onnxep.providers_cpu.threads import cpu_count

    assert CONV_SPLIT_MACS == nn_cpu._PARALLEL_MIN  # noqa: SLF001  (the two bounds are one)
    assert choose(CONV_SPLIT_MACS - 1, 2, CONV_SPLIT_MACS) == 1
    assert choose(CONV_SPLIT_MACS, 2, CONV_SPLIT_MACS) == 2
    # 512 -> 512 1x1 on 7x7 (MobileNetV3's, 12.8M): one thread
    conv = onnxep.InferenceSession(_conv_model(512, 512, 7), providers=["cpu"])
    assert conv.providers[0].blas_thread_count == 1
    assert "12.8M multiply-adds, under the 16.8M a split needs" in _cpu_note(conv)
    # 512 -> 512 1x1 on 8x8 (16.8M): every core
    conv = onnxep.InferenceSession(_conv_model(512, 512, 8), providers=["cpu"])
    assert conv.providers[0].blas_thread_count == cpu_count()
    # a 128 x 256 x 256 MatMul (8.4M): every core, at BLAS's bound
    mid = onnxep.InferenceSession(_gemm_model(128, 256, 256), providers=["cpu"])
    assert 128 * 256 * 256 >= MIN_SPLIT_MACS
    assert mid.providers[0].blas_thread_count == cpu_count()
    assert "8.39M multiply-adds, at least the 4.19M a split needs" in _cpu_note(mid)
