"""The CPU provider's convolutions, pools and MatMulNBits against onnxruntime, interleaved.

    python bench/cpu_conv.py [--runs N] [--threads T] [--only NAME ...] [--json FILE]

Models: torch exports made here into a scratch folder (a MobileNetV2-style stack, a dense
VGG-style CNN, grouped and dilated convs, 1-D and 3-D convs, ConvTranspose, pools, and an
MLP quantized to 4 bits by onnxruntime's MatMulNBits quantizer at accuracy_level 4), the
repository's small ResNet, the text-detection CNN of the real-model corpus when it is
cached, and bench/run_all.py's tiny int4 decoder. Each runs onnxep ``["cpu"]`` and
onnxruntime's CPU provider in one process on the same inputs, alternating run by run
(``onnxep.tools.benchmark.bench``); the table gives medians and onnxep / onnxruntime.
``--threads`` sets both sides' ``intra_op_num_threads`` (0: each side's default).
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"


def _export(module, shape, path: Path) -> Path:
    import torch

    torch.manual_seed(0)
    module.eval()
    torch.onnx.export(
        module, (torch.randn(*shape),), str(path), input_names=["x"], opset_version=17, dynamo=False
    )
    return path


def _mobilenet():
    from torch import nn

    class Block(nn.Module):
        def __init__(self, c, e, stride):
            super().__init__()
            h = c * e
            self.b = nn.Sequential(
                nn.Conv2d(c, h, 1, bias=False),
                nn.BatchNorm2d(h),
                nn.ReLU6(),
                nn.Conv2d(h, h, 3, stride, 1, groups=h, bias=False),
                nn.BatchNorm2d(h),
                nn.ReLU6(),
                nn.Conv2d(h, c, 1, bias=False),
                nn.BatchNorm2d(c),
            )
            self.res = stride == 1

        def forward(self, x):
            y = self.b(x)
            return x + y if self.res else y

    return nn.Sequential(
        nn.Conv2d(3, 32, 3, 2, 1),
        nn.ReLU6(),
        Block(32, 1, 1),
        nn.Conv2d(32, 24, 1),
        Block(24, 6, 1),
        Block(24, 6, 2),
        Block(24, 6, 1),
        nn.Conv2d(24, 64, 1),
        Block(64, 6, 2),
        Block(64, 6, 1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )


def _torch_models():
    from torch import nn

    return {
        "mobilenet-style 1x3x224x224": (_mobilenet(), (1, 3, 224, 224)),
        "dense vgg-style 1x3x128x128": (
            nn.Sequential(
                nn.Conv2d(3, 64, 3, 1, 1),
                nn.ReLU(),
                nn.Conv2d(64, 64, 3, 1, 1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(64, 128, 3, 1, 1),
                nn.ReLU(),
                nn.Conv2d(128, 128, 3, 1, 1),
                nn.ReLU(),
                nn.MaxPool2d(2),
                nn.Conv2d(128, 256, 3, 1, 1),
                nn.ReLU(),
                nn.AvgPool2d(2),
                nn.Conv2d(256, 256, 3, 1, 1),
            ),
            (1, 3, 128, 128),
        ),
        "grouped+dilated 1x64x56x56": (
            nn.Sequential(
                nn.Conv2d(64, 128, 3, 1, 1, groups=8),
                nn.ReLU(),
                nn.Conv2d(128, 128, 3, 2, 2, dilation=2, groups=32),
                nn.ReLU(),
                nn.Conv2d(128, 128, 5, 1, 2, groups=4),
            ),
            (1, 64, 56, 56),
        ),
        "conv1d 2x80x400": (
            nn.Sequential(
                nn.Conv1d(80, 256, 5, 1, 2),
                nn.ReLU(),
                nn.Conv1d(256, 256, 3, 1, 1, groups=256),
                nn.Conv1d(256, 256, 3, 2, 1),
                nn.MaxPool1d(3, 2, 1),
                nn.Conv1d(256, 128, 3, 1, 2, dilation=2),
            ),
            (2, 80, 400),
        ),
        "conv3d 1x3x16x64x64": (
            nn.Sequential(
                nn.Conv3d(3, 32, 3, 1, 1),
                nn.ReLU(),
                nn.Conv3d(32, 32, 3, 2, 1, groups=32),
                nn.Conv3d(32, 64, 3, 1, 1),
                nn.MaxPool3d(2),
                nn.AvgPool3d(2),
            ),
            (1, 3, 16, 64, 64),
        ),
        "convtranspose 1x3x128x128": (
            nn.Sequential(
                nn.Conv2d(3, 64, 3, 2, 1),
                nn.ReLU(),
                nn.ConvTranspose2d(64, 32, 3, 2, 1, output_padding=1),
                nn.ReLU(),
                nn.ConvTranspose2d(32, 16, 4, 2, 1),
                nn.ConvTranspose2d(16, 16, 3, 1, 1, groups=4),
            ),
            (1, 3, 128, 128),
        ),
        "pools 1x3x256x256": (
            nn.Sequential(
                nn.Conv2d(3, 32, 3),
                nn.MaxPool2d(3, 2, 1, ceil_mode=True),
                nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
                nn.LPPool2d(2, 2),
                nn.AvgPool2d(3, 1, 1),
            ),
            (1, 3, 256, 256),
        ),
    }


def _int4_mlp(path: Path) -> Path:
    import onnx
    import torch
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Linear(896, 4864), torch.nn.SiLU(), torch.nn.Linear(4864, 896)
    ).eval()
    buf = io.BytesIO()
    torch.onnx.export(
        m, (torch.randn(1, 1, 896),), buf, input_names=["x"], opset_version=17, dynamo=False
    )
    q = MatMulNBitsQuantizer(
        onnx.load_from_string(buf.getvalue()), bits=4, block_size=32, accuracy_level=4
    )
    q.process()
    onnx.save(q.model.model, str(path))
    return path


def models(scratch: Path, wanted=lambda name: True) -> dict:
    """name -> (path, bench keyword arguments), for the names ``wanted`` keeps."""
    out = {}
    for name, (module, shape) in _torch_models().items():
        if wanted(name):
            slug = name.split()[0].replace("+", "_")
            out[name] = (_export(module, shape, scratch / f"{slug}.onnx"), {})
    int4 = "int4 MLP 896x4864x896, 1 row (MatMulNBits)"
    if wanted(int4):
        out[int4] = (_int4_mlp(scratch / "int4_mlp.onnx"), {})
    out["resnet_cnn 1x3x64x64"] = (DATA / "resnet_cnn.onnx", dict(dims={"batch": 1}))
    sys.path.insert(0, str(ROOT / "tests"))
    from real_models import CORPUS

    det = next(m for m in CORPUS if m.name == "rapidocr-det")
    if det.path.exists():
        out["rapidocr-det 1x3x320x320 (corpus)"] = (
            det.path,
            dict(dims={f"p2o.DynamicDimension.{i}": v for i, v in enumerate((1, 320, 320))}),
        )
    qwen = DATA / "genai" / "qwen2_int4" / "model.onnx"
    if qwen.exists():
        out["genai qwen2 tiny int4, decode 1 token"] = (qwen, dict(decode=32, context=16))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--only", nargs="*", default=None, help="substrings of model names")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from onnxep.tools.benchmark import bench

    if args.threads:
        _set_threads(args.threads)
    rows = []

    def wanted(name: str) -> bool:
        return not args.only or any(s in name for s in args.only)

    with tempfile.TemporaryDirectory() as tmp:
        for name, (path, kw) in models(Path(tmp), wanted).items():
            if not wanted(name):
                continue
            kw = dict(kw)
            runs = kw.pop("runs", args.runs)
            r = bench(
                str(path),
                providers=["cpu"],
                vs=["onnxruntime"],
                runs=runs,
                warmup=3,
                progress=False,
                **kw,
            )
            ours = r.summary["onnxep"]["median_ms"]
            peer = r.summary["onnxruntime"]["median_ms"]
            rows.append({"model": name, "onnxep_ms": ours, "onnxruntime_ms": peer})
            print(f"{name:48s} onnxep {ours:9.3f} ms  onnxruntime {peer:9.3f} ms  "
                  f"ratio {ours / peer:5.2f}", flush=True)  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"threads": args.threads, "rows": rows}, indent=1))
    return 0


def _set_threads(n: int) -> None:
    """Both sides' sessions on ``n`` intra-op threads."""
    import onnxruntime as ort

    import onnxep

    real_ort, real_ours = ort.InferenceSession, onnxep.InferenceSession

    def ort_session(path, sess_options=None, **kw):
        so = sess_options or ort.SessionOptions()
        so.intra_op_num_threads = n
        return real_ort(path, so, **kw)

    def our_session(path, sess_options=None, **kw):
        so = sess_options or onnxep.SessionOptions()
        so.intra_op_num_threads = n
        return real_ours(path, so, **kw)

    ort.InferenceSession = ort_session
    onnxep.InferenceSession = our_session


if __name__ == "__main__":
    raise SystemExit(main())
