"""Teacher-forced decoding and per-value probes, for comparing a model's runs on several sides.

A *side* is one runtime on one export of the same checkpoint: onnxep on a provider
list (``cpu``, ``cuda,cpu``) or onnxruntime's CPU provider (``ort``), on the fp32
or fp16 export or on ``fp32w16`` (the fp32 export with every weight the fp16
export rounds rounded the same way, computed in fp32: the share of the fp16
difference that the weights alone make).

:func:`teacher_forced` runs a side step by step as ``onnxep.generate`` does (a
``GreedyDecoder``: IO binding, the device's shared KV buffers, states updated in
place, CUDA graph capture) but feeds the reference's token at every step, so
every side's logits at step t answer the same question. :func:`probe_model`
writes a copy of a model whose graph also outputs chosen intermediate values,
and :func:`compare` measures them against the reference's.
"""

from __future__ import annotations

import gc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

#: the exports a side can run
VARIANTS = ("fp32", "fp16", "fp32w16")


@dataclass(frozen=True)
class Side:
    """``providers`` on export ``variant``; providers ``("ort",)`` is onnxruntime's CPU."""

    providers: tuple[str, ...]
    variant: str

    @classmethod
    def parse(cls, text: str, default_variant: str = "fp16") -> Side:
        """``cpu``, ``cuda,cpu:fp16``, ``ort:fp16``, ``cpu:fp32w16``."""
        provs, _, variant = text.partition(":")
        variant = variant or default_variant
        if variant not in VARIANTS:
            raise ValueError(f"side {text!r}: export {variant!r} is not one of {VARIANTS}")
        names = tuple(p.strip() for p in provs.split(",") if p.strip())
        if not names or ("ort" in names and len(names) > 1):
            raise ValueError(f"side {text!r}: give onnxep providers (cuda,cpu) or ort alone")
        return cls(names, variant)

    @property
    def label(self) -> str:
        return f"{','.join(self.providers)}:{self.variant}"

    @property
    def is_ort(self) -> bool:
        return self.providers == ("ort",)


@dataclass
class Trace:
    """One side's teacher-forced run: last-position logits per step (float32), own argmax."""

    side: Side
    logits: list[np.ndarray] = field(default_factory=list)
    top1: list[int] = field(default_factory=list)
    #: the feeds of the probed step, in host memory (states as this side carried them)
    probe_feeds: dict[str, np.ndarray] | None = None
    state_path: str = ""
    fusions: dict[str, int] = field(default_factory=dict)


def fusion_counts(session: Any) -> dict[str, int]:
    """Fires per fusion rule over every provider of an onnxep session."""
    out: dict[str, int] = {}
    for f in session.placement().fusions:
        for rule, n in f.by_rule.items():
            key = f"{f.provider}:{rule}"
            out[key] = out.get(key, 0) + n
    return out


def open_session(side: Side, path: Path) -> Any:
    if side.is_ort:
        import onnxruntime as ort

        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    import onnxep

    return onnxep.InferenceSession(str(path), providers=list(side.providers))


def teacher_forced(
    side: Side,
    path: Path,
    prompt: np.ndarray,
    steps: int,
    forced: Sequence[int] | None = None,
    probe_step: int | None = None,
) -> Trace:
    """``steps`` runs (the prefill, then one token each), feeding ``forced[t]`` after step t
    (the side's own argmax where ``forced`` is None: greedy decoding)."""
    trace = Trace(side)
    sess = open_session(side, path)
    if side.is_ort:
        _ort_loop(sess, trace, prompt, steps, forced, probe_step)
    else:
        from onnxep.generation.greedy import GreedyDecoder

        trace.fusions = fusion_counts(sess)
        # pipeline off: a pipelined step queues the next run (fed its own argmax) before
        # it returns, so the bound logits would be the next step's and forcing too late
        dec = GreedyDecoder(sess, prompt, steps, pipeline=False)
        trace.state_path = f"{dec.state_path} ({dec.state_note})"
        for t in range(steps):
            if t == probe_step:
                trace.probe_feeds = {k: np.array(v, copy=True) for k, v in dec.host_feeds().items()}
            dec.step()
            _record(trace, dec.io.get_outputs()[0].numpy())
            if forced is not None:
                # teacher forcing: the next run is fed the reference's token, not ours
                dec.ids = np.full((dec.batch, 1), int(forced[t]), np.int64)
    del sess
    gc.collect()
    return trace


def _record(trace: Trace, logits: np.ndarray) -> None:
    last = np.asarray(logits)[0, -1].astype(np.float32)
    trace.logits.append(last)
    trace.top1.append(int(np.argmax(last)))


def _ort_loop(sess, trace, prompt, steps, forced, probe_step) -> None:
    from onnxep.generation.spec import DecodeState, decode_spec

    spec = decode_spec(sess.get_inputs(), sess.get_outputs())
    names = [o.name for o in sess.get_outputs()]
    st = DecodeState(spec, prompt.shape[1], prompt=prompt)
    trace.state_path = "onnxruntime: outputs fed back as inputs in host memory"
    for t in range(steps):
        feeds = st.feeds()
        if t == probe_step:
            trace.probe_feeds = {k: np.array(v, copy=True) for k, v in feeds.items()}
        out = dict(zip(names, sess.run(None, feeds)))
        _record(trace, out[spec.logits])
        st.advance(out)
        if forced is not None:
            st.ids = np.full((st.batch, 1), int(forced[t]), np.int64)


# -- exports ---------------------------------------------------------------------------------


def round_weights_like(fp32_path: Path, fp16_path: Path, out_path: Path) -> Path:
    """The fp32 export with every initializer and Constant that the fp16 export stores in
    float16 replaced by those float16 values (in float32): fp16 weights, fp32 arithmetic."""
    half = onnx.load(str(fp16_path))
    rounded: dict[str, np.ndarray] = {}
    for t in half.graph.initializer:
        if t.data_type == TensorProto.FLOAT16:
            rounded[t.name] = numpy_helper.to_array(t).astype(np.float32)
    for n in half.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value" and a.t.data_type == TensorProto.FLOAT16:
                    rounded[n.output[0]] = numpy_helper.to_array(a.t).astype(np.float32)
    del half
    gc.collect()
    full = onnx.load(str(fp32_path))
    for i, t in enumerate(full.graph.initializer):
        if t.name in rounded and t.data_type == TensorProto.FLOAT:
            full.graph.initializer[i].CopyFrom(numpy_helper.from_array(rounded[t.name], t.name))
    for n in full.graph.node:
        if n.op_type == "Constant" and n.output[0] in rounded:
            for a in n.attribute:
                if a.name == "value" and a.t.data_type == TensorProto.FLOAT:
                    a.t.CopyFrom(numpy_helper.from_array(rounded[n.output[0]], a.t.name))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(
        full,
        str(out_path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=out_path.name + ".data",
        size_threshold=1024,
    )
    return out_path


# -- probes ----------------------------------------------------------------------------------

_INT_OUT = {"Shape": TensorProto.INT64, "Size": TensorProto.INT64, "NonZero": TensorProto.INT64}


def value_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element types of every value, propagated in node order: a Cast gives its ``to``,
    a Shape-like op int64, any other op its first typed input's type (true of every float
    op a decoder export holds: norms, products, attention, conv)."""
    g = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*g.input, *g.output, *g.value_info]}
    types.update({t.name: t.data_type for t in g.initializer})
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    types[n.output[0]] = a.t.data_type
            continue
        if n.op_type == "Cast":
            to = next(a.i for a in n.attribute if a.name == "to")
            types.setdefault(n.output[0], to)
            continue
        elem = _INT_OUT.get(n.op_type) or next(
            (types[i] for i in n.input if i and types.get(i)), TensorProto.UNDEFINED
        )
        for o in n.output:
            if o:
                types.setdefault(o, elem)
    return types


def probe_model(path: Path, names: Sequence[str], out_path: Path) -> Path:
    """A copy of ``path`` that also outputs ``names`` (its weights stay in ``path``'s data
    file: write ``out_path`` in the same folder)."""
    model = onnx.load(str(path), load_external_data=False)
    types = value_types(model)
    have = {o.name for o in model.graph.output}
    for name in names:
        if name not in have:
            model.graph.output.append(helper.make_tensor_value_info(name, types[name], None))
    onnx.save(model, str(out_path))
    return out_path


def run_probe(side: Side, path: Path, names: Sequence[str], feeds_list: Sequence[Mapping]):
    """Each feeds' values of ``names`` (float32), and the probe session's fusion counts."""
    sess = open_session(side, path)
    fusions = {} if side.is_ort else fusion_counts(sess)
    declared = {a.name: a for a in sess.get_inputs()}
    results = []
    for feeds in feeds_list:
        cast = {k: np.asarray(v).astype(_np_type(declared[k].type)) for k, v in feeds.items()}
        out = sess.run(list(names), cast)
        results.append({n: np.asarray(v).astype(np.float32) for n, v in zip(names, out)})
    del sess
    gc.collect()
    return results, fusions


def _np_type(type_str: str) -> type:
    return {
        "tensor(float16)": np.float16,
        "tensor(float)": np.float32,
        "tensor(int64)": np.int64,
        "tensor(int32)": np.int32,
    }[type_str]


def compare(got: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """max |got - ref|, that over max |ref|, and the RMS relative error ||d|| / ||ref||."""
    d = got.astype(np.float64) - ref.astype(np.float64)
    ref_max = float(np.max(np.abs(ref))) if ref.size else 0.0
    ref_norm = float(np.linalg.norm(ref))
    abs_err = float(np.max(np.abs(d))) if d.size else 0.0
    return {
        "max_abs": abs_err,
        "max_rel": abs_err / ref_max if ref_max else abs_err,
        "rms_rel": float(np.linalg.norm(d)) / ref_norm if ref_norm else float(np.linalg.norm(d)),
    }


def margin(logits: np.ndarray) -> float:
    """top-1 minus top-2 logit."""
    top2 = np.partition(logits, -2)[-2:]
    return float(top2[1] - top2[0])
