"""Convolutions and pooling through cuDNN's legacy C API, called through ctypes.

Modelled on :mod:`.blas`: one handle per thread and device, the current CuPy stream set
on it before every call, workspaces from CuPy's memory pool (the graph's pool inside a
capture), nothing that synchronizes or reads device memory on the host. The library is
found and loaded by :mod:`.dnn_library` (which needs no CuPy); docs/cudnn.md says why
the legacy API and not the graph API or cuDNN's Python frontend.

The objects here are built once per (shapes, dtype, attributes) by the kernels in
``providers_cuda/ops`` from a geometry of :mod:`.ops.conv_plan`, and keep their
descriptors and their algorithm: :class:`ConvForward`, :class:`ConvBackwardData`,
:class:`Pooling` and :class:`BiasAdd`. The algorithm is measured with cuDNN's
``Find...Ex`` on the first call made outside stream capture (``$ONNXEP_CUDNN_ALGO``
= ``heuristic`` takes cuDNN's first heuristic choice instead); a first call inside a
capture never measures: it takes the heuristic choice and keeps it.

Numerics: float16 runs on tensor cores with float32 accumulation (compute type float,
CUDNN_TENSOR_OP_MATH); float32 with CUDNN_FMA_MATH (no TF32), so results match the CPU
provider within float32 tolerances, as cuBLAS does in :mod:`.blas`, unless the run allows
TF32 (the provider's ``use_tf32`` option, :mod:`.math_mode`: then the measured algorithm's
own math type, tensor ops included); float64 in float64.

Values and signatures (cuDNN 9 headers; the legacy functions are unchanged from 8.x):

- cudnn_graph.h: ``cudnnDataType_t`` FLOAT 0, DOUBLE 1, HALF 2; ``cudnnTensorFormat_t``
  NCHW 0; ``cudnnMathType_t`` DEFAULT 0, TENSOR_OP 1, TENSOR_OP_ALLOW_CONVERSION 2,
  FMA 3; ``cudnnNanPropagation_t`` NOT_PROPAGATE 0, PROPAGATE 1; status 0 is success
  (cuDNN 9 groups the others by thousands: 2xxx bad parameter, 3xxx not supported);
  cudnnCreate, cudnnSetStream, cudnnGetErrorString.
- cudnn_ops.h: cudnnSetTensorNdDescriptor(desc, dtype, nbDims, dims[], strides[]);
  cudnnSetFilterNdDescriptor(desc, dtype, format, nbDims, dims[]);
  cudnnSetPoolingNdDescriptor(desc, mode, nanOpt, nbDims, window[], pad[], stride[]);
  cudnnGetPoolingNdForwardOutputDim(desc, xDesc, nbDims, out[]);
  cudnnPoolingForward(h, desc, *alpha, xDesc, x, *beta, yDesc, y);
  cudnnAddTensor(h, *alpha, aDesc, a, *beta, cDesc, c);
  cudnnSetActivationDescriptor(desc, mode, nanOpt, double coef); ``cudnnPoolingMode_t``
  MAX 0, AVERAGE_COUNT_INCLUDE_PADDING 1, AVERAGE_COUNT_EXCLUDE_PADDING 2;
  ``cudnnActivationMode_t`` SIGMOID 0, RELU 1, TANH 2, CLIPPED_RELU 3, ELU 4, IDENTITY 5.
- cudnn_cnn.h: cudnnSetConvolutionNdDescriptor(desc, n, pad[], stride[], dilation[],
  mode, computeType) with CROSS_CORRELATION 1; cudnnSetConvolutionGroupCount;
  cudnnSetConvolutionMathType; cudnnGetConvolutionNdForwardOutputDim(desc, xDesc,
  wDesc, nbDims, out[]); cudnnGetConvolutionForwardAlgorithm_v7 /
  cudnnFindConvolutionForwardAlgorithmEx / cudnnGetConvolutionForwardWorkspaceSize /
  cudnnConvolutionForward / cudnnConvolutionBiasActivationForward, and the
  BackwardData ones with the same shapes; ``cudnnConvolutionFwdAlgoPerf_t`` and
  ``cudnnConvolutionBwdDataAlgoPerf_t`` are {int algo; int status; float time; size_t
  memory; int determinism; int mathType; int reserved[3]}; forward algo 1 is
  IMPLICIT_PRECOMP_GEMM (the only one taking an IDENTITY activation, hence: bias
  without an activation is conv + cudnnAddTensor here).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Sequence
from typing import Any

from . import dnn_library
from .math_mode import tf32

__all__ = [
    "SUPPORTED_DTYPES",
    "ConvBackwardData",
    "ConvForward",
    "DnnError",
    "BiasAdd",
    "Pooling",
    "unavailable_reason",
]

#: dtype names these calls take; others go to the generic kernels.
SUPPORTED_DTYPES = frozenset({"float32", "float16", "float64"})

_FLOAT, _DOUBLE, _HALF = 0, 1, 2
_NCHW = 0
_CROSS_CORRELATION = 1
_DEFAULT_MATH, _TENSOR_OP_MATH, _TENSOR_OP_ALLOW_CONVERSION, _FMA_MATH = 0, 1, 2, 3
_PROPAGATE_NAN = 1
POOL_MODES = {"max": 0, "avg_include": 1, "avg_exclude": 2}
ACT_RELU, ACT_CLIPPED_RELU = 1, 3
_DTYPE = {"float32": _FLOAT, "float16": _HALF, "float64": _DOUBLE}
_COMPUTE = {"float32": _FLOAT, "float16": _FLOAT, "float64": _DOUBLE}
_MATH = {"float32": _FMA_MATH, "float16": _TENSOR_OP_MATH, "float64": _DEFAULT_MATH}
# Perf results a dtype may use: float32 never a tensor-op (TF32) one unless TF32 is allowed.
_TF32_MATH = {_DEFAULT_MATH, _TENSOR_OP_MATH, _TENSOR_OP_ALLOW_CONVERSION, _FMA_MATH}
_ALLOWED_MATH = {
    "float32": {_DEFAULT_MATH, _FMA_MATH},
    "float16": {_DEFAULT_MATH, _TENSOR_OP_MATH, _FMA_MATH},
    "float64": {_DEFAULT_MATH, _FMA_MATH},
}
#: The most workspace an algorithm may take (cuDNN's Find gets this much to try them in).
WORKSPACE_LIMIT = 256 * 1024 * 1024
ALGO_ENV = "ONNXEP_CUDNN_ALGO"
_ALGO_COUNT = 8

# Host scalars for alpha/beta (float for half and float data, double for double).
_ONE_F, _ZERO_F = ctypes.c_float(1.0), ctypes.c_float(0.0)
_ONE_D, _ZERO_D = ctypes.c_double(1.0), ctypes.c_double(0.0)


class DnnError(RuntimeError):
    """A cuDNN call failed (or cuDNN cannot be used); the message says which and why."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status

    @property
    def not_supported(self) -> bool:
        """cuDNN refused the configuration (8.x: 9 NOT_SUPPORTED, 3 BAD_PARAM; 9.x: 3xxx, 2xxx)."""
        s = self.status
        return s in (3, 9) or 2000 <= s < 4000


class _Perf(ctypes.Structure):
    _fields_ = [
        ("algo", ctypes.c_int),
        ("status", ctypes.c_int),
        ("time", ctypes.c_float),
        ("memory", ctypes.c_size_t),
        ("determinism", ctypes.c_int),
        ("mathType", ctypes.c_int),
        ("reserved", ctypes.c_int * 3),
    ]


def unavailable_reason() -> str | None:
    """None when cuDNN loads here, else why not (the same sentence ``onnxep providers`` shows)."""
    _preload_cublas()
    return dnn_library.unavailable_reason()


# -- the library's entry points ------------------------------------------------------


_preloaded = False


def _preload_cublas() -> None:
    """Load CuPy's cuBLAS (and cuBLASLt) before cuDNN opens its sub-libraries.

    They link against cuBLAS(Lt); with CuPy's copies in the process the loader finds them
    by soname, where a wheel install has them off the default path."""
    global _preloaded
    if _preloaded:
        return
    _preloaded = True
    try:
        import cupy

        cupy.cuda.device.get_cublas_handle()
    except Exception:  # no cuBLAS: cuDNN's own load then says what is missing
        pass


class _Api:
    def __init__(self) -> None:
        _preload_cublas()
        try:
            loaded = dnn_library.library()
        except dnn_library.DnnLoadError as exc:
            raise DnnError(str(exc)) from None
        lib = loaded.lib
        self.path = loaded.path
        self.version = loaded.version
        vp, i32, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        pi = ctypes.POINTER(ctypes.c_int)
        pvp = ctypes.POINTER(vp)
        psz = ctypes.POINTER(ctypes.c_size_t)
        pperf = ctypes.POINTER(_Perf)

        def fn(name: str, argtypes: list[Any]) -> Any:
            f = getattr(lib, name)
            f.argtypes = argtypes
            f.restype = ctypes.c_int
            return f

        err = lib.cudnnGetErrorString
        err.argtypes = [ctypes.c_int]
        err.restype = ctypes.c_char_p
        self.error_string = err
        self.create = fn("cudnnCreate", [pvp])
        self.set_stream = fn("cudnnSetStream", [vp, vp])
        for kind in ("Tensor", "Filter", "Convolution", "Pooling", "Activation"):
            setattr(self, f"create_{kind.lower()}", fn(f"cudnnCreate{kind}Descriptor", [pvp]))
            setattr(self, f"destroy_{kind.lower()}", fn(f"cudnnDestroy{kind}Descriptor", [vp]))
        self.set_tensor = fn("cudnnSetTensorNdDescriptor", [vp, i32, i32, pi, pi])
        self.set_filter = fn("cudnnSetFilterNdDescriptor", [vp, i32, i32, i32, pi])
        self.set_conv = fn("cudnnSetConvolutionNdDescriptor", [vp, i32, pi, pi, pi, i32, i32])
        self.set_group = fn("cudnnSetConvolutionGroupCount", [vp, i32])
        self.set_math = fn("cudnnSetConvolutionMathType", [vp, i32])
        self.conv_out_dim = fn("cudnnGetConvolutionNdForwardOutputDim", [vp, vp, vp, i32, pi])
        self.fwd_heuristic = fn(
            "cudnnGetConvolutionForwardAlgorithm_v7", [vp, vp, vp, vp, vp, i32, pi, pperf]
        )
        self.fwd_find = fn(
            "cudnnFindConvolutionForwardAlgorithmEx",
            [vp, vp, vp, vp, vp, vp, vp, vp, i32, pi, pperf, vp, sz],
        )
        self.fwd_workspace = fn(
            "cudnnGetConvolutionForwardWorkspaceSize", [vp, vp, vp, vp, vp, i32, psz]
        )
        self.fwd = fn(
            "cudnnConvolutionForward", [vp, vp, vp, vp, vp, vp, vp, i32, vp, sz, vp, vp, vp]
        )
        self.fwd_bias_act = fn(
            "cudnnConvolutionBiasActivationForward",
            [vp, vp, vp, vp, vp, vp, vp, i32, vp, sz, vp, vp, vp, vp, vp, vp, vp, vp],
        )
        self.bwd_heuristic = fn(
            "cudnnGetConvolutionBackwardDataAlgorithm_v7", [vp, vp, vp, vp, vp, i32, pi, pperf]
        )
        self.bwd_find = fn(
            "cudnnFindConvolutionBackwardDataAlgorithmEx",
            [vp, vp, vp, vp, vp, vp, vp, vp, i32, pi, pperf, vp, sz],
        )
        self.bwd_workspace = fn(
            "cudnnGetConvolutionBackwardDataWorkspaceSize", [vp, vp, vp, vp, vp, i32, psz]
        )
        self.bwd = fn(
            "cudnnConvolutionBackwardData", [vp, vp, vp, vp, vp, vp, vp, i32, vp, sz, vp, vp, vp]
        )
        self.set_pool = fn("cudnnSetPoolingNdDescriptor", [vp, i32, i32, i32, pi, pi, pi])
        self.pool_out_dim = fn("cudnnGetPoolingNdForwardOutputDim", [vp, vp, i32, pi])
        self.pool = fn("cudnnPoolingForward", [vp, vp, vp, vp, vp, vp, vp, vp])
        self.add_tensor = fn("cudnnAddTensor", [vp, vp, vp, vp, vp, vp, vp])
        self.set_activation = fn("cudnnSetActivationDescriptor", [vp, i32, i32, ctypes.c_double])

    def check(self, status: int, what: str) -> None:
        if status != 0:
            try:
                text = (self.error_string(status) or b"?").decode(errors="replace")
            except Exception:
                text = "?"
            raise DnnError(f"{what} failed: {text} (cuDNN status {status})", status)


_api_obj: _Api | None = None
_api_lock = threading.Lock()


def api() -> _Api:
    """The loaded library (DnnError when cuDNN cannot be used here)."""
    global _api_obj
    if _api_obj is None:
        with _api_lock:
            if _api_obj is None:
                _api_obj = _Api()
    return _api_obj


# -- handles -------------------------------------------------------------------------

_local = threading.local()


def _handle() -> int:
    """This thread's handle on the current device, set to the current CuPy stream."""
    import cupy

    a = api()
    dev = cupy.cuda.runtime.getDevice()
    stream = cupy.cuda.get_current_stream().ptr
    handles = getattr(_local, "handles", None)
    if handles is None:
        handles = _local.handles = {}
    h = handles.get(dev)
    if h is None:
        ptr = ctypes.c_void_p()
        a.check(a.create(ctypes.byref(ptr)), "cudnnCreate")
        h = handles[dev] = [ptr.value, None]
    if h[1] != stream:
        a.check(a.set_stream(h[0], stream), "cudnnSetStream")
        h[1] = stream
    return h[0]


def capturing() -> bool:
    """Whether the current CuPy stream is being captured into a CUDA graph."""
    import cupy

    stream = cupy.cuda.get_current_stream()
    try:
        return bool(stream.is_capturing())
    except AttributeError:
        return bool(cupy.cuda.runtime.streamIsCapturing(stream.ptr))


# -- descriptors ---------------------------------------------------------------------


def _ints(values: Sequence[int]) -> Any:
    return (ctypes.c_int * len(values))(*[int(v) for v in values])


def _contiguous_strides(shape: Sequence[int]) -> list[int]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(int(d), 1)
    return out[::-1]


class _Descriptor:
    """One cuDNN descriptor, destroyed with the object."""

    def __init__(self, kind: str) -> None:
        a = api()
        self._destroy = getattr(a, f"destroy_{kind}")
        ptr = ctypes.c_void_p()
        a.check(getattr(a, f"create_{kind}")(ctypes.byref(ptr)), f"cudnnCreate{kind}Descriptor")
        self.ptr = ptr.value

    def __del__(self) -> None:
        ptr, self.ptr = getattr(self, "ptr", None), None
        if ptr:
            try:
                self._destroy(ptr)
            except Exception:
                pass


def _tensor(dtype: str, shape: Sequence[int]) -> _Descriptor:
    d = _Descriptor("tensor")
    n = len(shape)
    api().check(
        api().set_tensor(d.ptr, _DTYPE[dtype], n, _ints(shape), _ints(_contiguous_strides(shape))),
        f"cudnnSetTensorNdDescriptor({dtype}, {tuple(shape)})",
    )
    return d


def _filter(dtype: str, shape: Sequence[int]) -> _Descriptor:
    d = _Descriptor("filter")
    api().check(
        api().set_filter(d.ptr, _DTYPE[dtype], _NCHW, len(shape), _ints(shape)),
        f"cudnnSetFilterNdDescriptor({dtype}, {tuple(shape)})",
    )
    return d


def _scalars(dtype: str) -> tuple[Any, Any]:
    return (_ONE_D, _ZERO_D) if dtype == "float64" else (_ONE_F, _ZERO_F)


def _ref(c: Any) -> int:
    return ctypes.addressof(c)


def _expect(x: Any, shape: Sequence[int], dtype: str, what: str) -> None:
    """A buffer handed to cuDNN has exactly the descriptor's shape, dtype and layout."""
    if tuple(x.shape) != tuple(shape) or x.dtype.name != dtype or not x.flags.c_contiguous:
        raise DnnError(
            f"{what}: expected a C-contiguous {dtype} array of shape {tuple(shape)}, got "
            f"{x.dtype.name} {tuple(x.shape)} (contiguous: {bool(x.flags.c_contiguous)})"
        )


def _workspace(size: int) -> Any:
    import cupy

    return cupy.empty((max(int(size), 1),), dtype=cupy.uint8)


def _search_mode() -> str:
    v = os.environ.get(ALGO_ENV, "").strip().lower()
    if v in ("", "exhaustive", "find"):
        return "find"
    if v in ("heuristic", "heuristics"):
        return "heuristic"
    raise DnnError(f"${ALGO_ENV} must be 'exhaustive' or 'heuristic', got {v!r}")


def _pick(perfs: Any, count: int, dtype: str, what: str, use_tf32: bool) -> _Perf:
    tried = []
    allowed = _TF32_MATH if use_tf32 else _ALLOWED_MATH[dtype]
    for i in range(count):
        p = perfs[i]
        if p.status == 0 and p.mathType in allowed and p.memory <= WORKSPACE_LIMIT:
            return p
        tried.append(f"algo {p.algo}: status {p.status}, math {p.mathType}, {p.memory} B")
    raise DnnError(
        f"{what}: cuDNN offered no usable algorithm ({'; '.join(tried) or 'none'})", 3000
    )


class _ConvBase:
    """Descriptors of one convolution (input x, filter w, output y, conv) and its algorithm."""

    def __init__(self, geom: Any, dtype: str, x_shape, w_shape, y_shape) -> None:
        a = api()
        if dtype not in SUPPORTED_DTYPES:
            raise DnnError(f"cuDNN convolution takes float16, float32 or float64, got {dtype}")
        self.dtype = dtype
        self.x_shape, self.w_shape, self.y_shape = tuple(x_shape), tuple(w_shape), tuple(y_shape)
        self.x_desc = _tensor(dtype, x_shape)
        self.w_desc = _filter(dtype, w_shape)
        self.y_desc = _tensor(dtype, y_shape)
        self.conv = _Descriptor("convolution")
        nsp = len(geom.pads)
        a.check(
            a.set_conv(
                self.conv.ptr,
                nsp,
                _ints(geom.pads),
                _ints(geom.strides),
                _ints(geom.dilations),
                _CROSS_CORRELATION,
                _COMPUTE[dtype],
            ),
            f"cudnnSetConvolutionNdDescriptor(pads {geom.pads}, strides {geom.strides}, "
            f"dilations {geom.dilations})",
        )
        a.check(a.set_group(self.conv.ptr, int(geom.group)), "cudnnSetConvolutionGroupCount")
        #: float32 on TF32 tensor cores (fixed at build: a plan keeps the math it measured)
        self.tf32 = dtype == "float32" and tf32()
        math = _DEFAULT_MATH if self.tf32 else _MATH[dtype]
        a.check(a.set_math(self.conv.ptr, math), "cudnnSetConvolutionMathType")
        self.algo: int | None = None
        self.workspace = 0
        self.how = ""

    def _heuristic_descs(self) -> tuple:
        """The four descriptors the algorithm and workspace queries take, in their order."""
        raise NotImplementedError

    def _check_forward_dims(self, in_desc: Any, in_shape, out_shape) -> None:
        """cuDNN's own output size for (in, w, conv) must be the planned one."""
        a = api()
        n = len(in_shape)
        dims = (ctypes.c_int * n)()
        a.check(
            a.conv_out_dim(self.conv.ptr, in_desc.ptr, self.w_desc.ptr, n, dims),
            "cudnnGetConvolutionNdForwardOutputDim",
        )
        if tuple(dims) != tuple(out_shape):
            raise DnnError(
                f"cuDNN computes output {tuple(dims)} for input {tuple(in_shape)}, weight "
                f"{self.w_shape}, the plan says {tuple(out_shape)}: an onnxep bug, please report"
            )

    def _choose(self, heuristic, find, workspace_size, args_find) -> None:
        """Pick the algorithm: measured once outside capture, else cuDNN's heuristic."""
        a = api()
        h = _handle()
        perfs = (_Perf * _ALGO_COUNT)()
        count = ctypes.c_int(0)
        what = type(self).__name__
        measure = _search_mode() == "find" and not capturing()
        if measure:
            ws = _workspace(WORKSPACE_LIMIT)
            a.check(
                find(h, *args_find(), _ALGO_COUNT, ctypes.byref(count), perfs, ws.data.ptr,
                     WORKSPACE_LIMIT),
                f"{what}: cudnnFind...AlgorithmEx",
            )  # fmt: skip
            del ws
            self.how = "measured (cudnnFind...AlgorithmEx)"
        else:
            a.check(
                heuristic(h, *self._heuristic_descs(), _ALGO_COUNT, ctypes.byref(count), perfs),
                f"{what}: cudnnGet...Algorithm_v7",
            )
            self.how = "cuDNN heuristic" + (" (first call inside a capture)" if capturing() else "")
        p = _pick(perfs, count.value, self.dtype, what, self.tf32)
        if self.dtype == "float16" or self.tf32:
            # Half data (or TF32 allowed): the measured math type (tensor ops, or default
            # where cuDNN chose it). float32 otherwise keeps FMA_MATH whatever a result
            # reports: DEFAULT_MATH would permit TF32.
            a.check(a.set_math(self.conv.ptr, int(p.mathType)), "cudnnSetConvolutionMathType")
        size = ctypes.c_size_t(0)
        a.check(
            workspace_size(h, *self._heuristic_descs(), int(p.algo), ctypes.byref(size)),
            f"{what}: workspace size of algo {p.algo}",
        )
        self.algo, self.workspace = int(p.algo), int(size.value)


class ConvForward(_ConvBase):
    """``y = conv(x, w)`` (optionally ``act(conv + bias)`` fused) for one geometry and dtype."""

    def __init__(self, geom: Any, dtype: str) -> None:
        super().__init__(geom, dtype, geom.x_shape, geom.w_shape, geom.y_shape)
        self._check_forward_dims(self.x_desc, self.x_shape, self.y_shape)
        self._bias_desc: _Descriptor | None = None
        self._act: dict[tuple[int, float], _Descriptor] = {}

    def _heuristic_descs(self) -> tuple:
        return (self.x_desc.ptr, self.w_desc.ptr, self.conv.ptr, self.y_desc.ptr)

    def _ensure_algo(self, x: Any, w: Any, y: Any) -> None:
        if self.algo is None:
            a = api()
            self._choose(
                a.fwd_heuristic,
                a.fwd_find,
                a.fwd_workspace,
                lambda: (self.x_desc.ptr, x.data.ptr, self.w_desc.ptr, w.data.ptr, self.conv.ptr,
                         self.y_desc.ptr, y.data.ptr),
            )  # fmt: skip

    def __call__(self, x: Any, w: Any) -> Any:
        """A fresh ``y`` (C-contiguous, this geometry's ``y_shape``)."""
        import cupy

        dt = self.dtype
        _expect(x, self.x_shape, dt, "Conv input")
        _expect(w, self.w_shape, dt, "Conv weight")
        y = cupy.empty(self.y_shape, dtype=x.dtype)
        self._ensure_algo(x, w, y)
        a = api()
        one, zero = _scalars(dt)
        ws = _workspace(self.workspace) if self.workspace else None
        a.check(
            a.fwd(_handle(), _ref(one), self.x_desc.ptr, x.data.ptr, self.w_desc.ptr, w.data.ptr,
                  self.conv.ptr, self.algo, ws.data.ptr if ws is not None else None,
                  self.workspace, _ref(zero), self.y_desc.ptr, y.data.ptr),
            "cudnnConvolutionForward",
        )  # fmt: skip
        del ws
        return y

    def activation(self, mode: int, coef: float) -> _Descriptor:
        """The activation descriptor of (mode, coef), made once."""
        d = self._act.get((mode, coef))
        if d is None:
            d = _Descriptor("activation")
            api().check(
                api().set_activation(d.ptr, mode, _PROPAGATE_NAN, float(coef)),
                "cudnnSetActivationDescriptor",
            )
            self._act[(mode, coef)] = d
        return d

    def bias_activation(self, x: Any, w: Any, bias: Any, mode: int, coef: float = 0.0) -> Any:
        """``act(conv(x, w) + bias)`` in one call: RELU, or CLIPPED_RELU with ceiling ``coef``."""
        import cupy

        dt = self.dtype
        _expect(x, self.x_shape, dt, "FusedConv input")
        _expect(w, self.w_shape, dt, "FusedConv weight")
        m = self.y_shape[1]
        _expect(bias, (m,), dt, "FusedConv bias")
        if self._bias_desc is None:
            self._bias_desc = _tensor(dt, (1, m, *([1] * (len(self.y_shape) - 2))))
        if self.algo is None:
            self._ensure_algo(x, w, cupy.empty(self.y_shape, dtype=x.dtype))
        # z is y with alpha2 = 0; y is zeroed so that no stale NaN can reach the sum.
        y = cupy.zeros(self.y_shape, dtype=x.dtype)
        a = api()
        one, zero = _scalars(dt)
        ws = _workspace(self.workspace) if self.workspace else None
        a.check(
            a.fwd_bias_act(_handle(), _ref(one), self.x_desc.ptr, x.data.ptr, self.w_desc.ptr,
                           w.data.ptr, self.conv.ptr, self.algo,
                           ws.data.ptr if ws is not None else None, self.workspace, _ref(zero),
                           self.y_desc.ptr, y.data.ptr, self._bias_desc.ptr, bias.data.ptr,
                           self.activation(mode, coef).ptr, self.y_desc.ptr, y.data.ptr),
            "cudnnConvolutionBiasActivationForward",
        )  # fmt: skip
        del ws
        return y


class ConvBackwardData(_ConvBase):
    """ConvTranspose: ``dx`` of the forward conv (input ``dx_shape``) for gradient ``x``."""

    def __init__(self, geom: Any, dtype: str) -> None:
        # The forward conv reads dx (the ConvTranspose output) and writes x (its input).
        super().__init__(geom, dtype, geom.dx_shape, geom.w_shape, geom.x_shape)
        self.dx_desc, self.dy_desc = self.x_desc, self.y_desc
        self._check_forward_dims(self.dx_desc, geom.dx_shape, geom.x_shape)

    def _heuristic_descs(self) -> tuple:
        return (self.w_desc.ptr, self.dy_desc.ptr, self.conv.ptr, self.dx_desc.ptr)

    def __call__(self, dy: Any, w: Any) -> Any:
        import cupy

        dt = self.dtype
        _expect(dy, self.y_shape, dt, "ConvTranspose input")
        _expect(w, self.w_shape, dt, "ConvTranspose weight")
        dx = cupy.empty(self.x_shape, dtype=dy.dtype)
        if self.algo is None:
            a = api()
            self._choose(
                a.bwd_heuristic,
                a.bwd_find,
                a.bwd_workspace,
                lambda: (self.w_desc.ptr, w.data.ptr, self.dy_desc.ptr, dy.data.ptr,
                         self.conv.ptr, self.dx_desc.ptr, dx.data.ptr),
            )  # fmt: skip
        a = api()
        one, zero = _scalars(dt)
        ws = _workspace(self.workspace) if self.workspace else None
        a.check(
            a.bwd(_handle(), _ref(one), self.w_desc.ptr, w.data.ptr, self.dy_desc.ptr,
                  dy.data.ptr, self.conv.ptr, self.algo,
                  ws.data.ptr if ws is not None else None, self.workspace, _ref(zero),
                  self.dx_desc.ptr, dx.data.ptr),
            "cudnnConvolutionBackwardData",
        )  # fmt: skip
        del ws
        return dx


class Pooling:
    """One pooling call (max, or average counting pads or not) for one geometry and dtype."""

    def __init__(self, geom: Any, dtype: str) -> None:
        a = api()
        if dtype not in SUPPORTED_DTYPES:
            raise DnnError(f"cuDNN pooling takes float16, float32 or float64, got {dtype}")
        self.dtype = dtype
        self.x_shape, self.y_shape = tuple(geom.x_shape), tuple(geom.y_shape)
        self.x_desc = _tensor(dtype, self.x_shape)
        self.y_desc = _tensor(dtype, self.y_shape)
        self.desc = _Descriptor("pooling")
        nsp = len(geom.window)
        a.check(
            a.set_pool(self.desc.ptr, POOL_MODES[geom.mode], _PROPAGATE_NAN, nsp,
                       _ints(geom.window), _ints(geom.pads), _ints(geom.strides)),
            f"cudnnSetPoolingNdDescriptor(window {geom.window}, pads {geom.pads}, strides "
            f"{geom.strides})",
        )  # fmt: skip
        n = len(self.x_shape)
        dims = (ctypes.c_int * n)()
        a.check(
            a.pool_out_dim(self.desc.ptr, self.x_desc.ptr, n, dims),
            "cudnnGetPoolingNdForwardOutputDim",
        )
        if tuple(dims) != self.y_shape:
            raise DnnError(
                f"cuDNN pools {self.x_shape} to {tuple(dims)}, the plan says {self.y_shape}: "
                "an onnxep bug, please report"
            )

    def __call__(self, x: Any) -> Any:
        import cupy

        _expect(x, self.x_shape, self.dtype, "pooling input")
        y = cupy.empty(self.y_shape, dtype=x.dtype)
        a = api()
        one, zero = _scalars(self.dtype)
        a.check(
            a.pool(_handle(), self.desc.ptr, _ref(one), self.x_desc.ptr, x.data.ptr, _ref(zero),
                   self.y_desc.ptr, y.data.ptr),
            "cudnnPoolingForward",
        )  # fmt: skip
        return y


class BiasAdd:
    """``y += bias`` broadcast over channel axis 1, in place (cudnnAddTensor), for one shape."""

    def __init__(self, shape: Sequence[int], dtype: str) -> None:
        if dtype not in SUPPORTED_DTYPES:
            raise DnnError(f"cudnnAddTensor takes float16, float32 or float64 here, got {dtype}")
        if len(shape) < 3:
            raise DnnError(f"a bias is added to an (N, C, ...) array, got shape {tuple(shape)}")
        self.dtype = dtype
        self.shape = tuple(int(d) for d in shape)
        # cuDNN's tensors have 4 dims or more: (N, C, L) is described as (N, C, 1, L).
        desc_shape = self.shape if len(self.shape) >= 4 else (*self.shape[:2], 1, *self.shape[2:])
        m = self.shape[1]
        self.b_desc = _tensor(dtype, (1, m, *([1] * (len(desc_shape) - 2))))
        self.y_desc = _tensor(dtype, desc_shape)

    def __call__(self, y: Any, bias: Any) -> Any:
        _expect(y, self.shape, self.dtype, "bias target")
        _expect(bias, (self.shape[1],), self.dtype, "bias")
        one, _zero = _scalars(self.dtype)
        a = api()
        a.check(
            a.add_tensor(_handle(), _ref(one), self.b_desc.ptr, bias.data.ptr, _ref(one),
                         self.y_desc.ptr, y.data.ptr),
            "cudnnAddTensor",
        )  # fmt: skip
        return y
