"""One model run once by onnxep's CPU provider and by onnxruntime's, each on one thread
unless told otherwise: the first output of each, for tests that hold a CPU kernel to
onnxruntime on the same model."""

from __future__ import annotations

import onnxruntime as ort

import onnxep


def ours(model, feeds: dict, threads: int = 1):
    so = onnxep.SessionOptions(intra_op_num_threads=threads)
    return onnxep.InferenceSession(model, so, providers=["cpu"]).run(None, feeds)[0]


def theirs(model, feeds: dict):
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
