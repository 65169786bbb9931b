"""LSTM, GRU and RNN on CUDA: one cuBLAS product for the input projection, one launch per run.

The generic kernels (``providers/ops/flow.py``) call CuPy's matmul at every time step,
which refuses inside stream capture, so a model with an LSTM split its CUDA graph there.
Here a run is:

1. ``xw = X W^T`` for every time step and both directions at once: one GEMM through the
   provider's own cuBLAS door (``providers_cuda/blas.py``, capture-safe), ``[T*batch,
   input] @ [input, dirs*gates*H]``, read in X's own row order (layout 0 or 1, no
   transpose); float16 inputs are widened to float32 first, so the projection and the
   state are float32 as on the CPU;
2. the recurrence in one kernel launch: one block per (direction, batch row), one thread
   per hidden unit (so :data:`MAX_HIDDEN` units at most). ``h_{t-1}`` sits in shared
   memory (double-buffered: one ``__syncthreads`` per step; GRU without
   ``linear_before_reset`` needs ``r * h`` of every unit before its candidate, so it
   syncs twice), the cell state and the unit's own gates in registers, and the
   recurrent weights are read from global memory as ``R^T`` (``[dirs, H, gates*H]``,
   one transposing copy per run, so a warp's loads are contiguous; L2-resident at the
   sizes that fit a block). Biases, peepholes, initial states, ``clip`` and every
   activation the generic kernel knows (with its alpha/beta) are read in the kernel;
   the outputs are written in the node's layout.

``sequence_lens`` is read on the device: a row's steps past its length write zeros to Y
and its Y_h/Y_c are its state at its last step (zeros for an empty row, as onnxruntime).
A value outside ``[0, seq_length]`` is clamped there, so nothing is read past X, and
recorded in the provider's error flag (``error_flag.SEQUENCE_LENGTH``), raised at the
run's next read of its results -- nothing is read back on the host, and the step can be
captured.

What the kernel does not take runs the generic kernel (not capture-safe), said when the
node is built where its static types show it (the step's capture note, shown by
``explain``) and counted per reason at run time otherwise (:attr:`Recurrence.fallbacks`):
a hidden size past :data:`MAX_HIDDEN`, a dtype other than float32/float16.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from onnxep.providers.kernel import not_capture_safe
from onnxep.providers.node import NodeInfo
from onnxep.providers.ops.flow import activation_specs

from .. import error_flag
from ..declines import CUPY_BLAS_NOTE
from . import index_cuda

#: Hidden units a block takes: one thread each (CUDA's 1024 threads per block).
MAX_HIDDEN = 1024
#: Cells the kernel knows, by op type: its CELL template argument and gates per unit.
CELLS = {"RNN": (0, 1), "GRU": (1, 3), "LSTM": (2, 4)}
#: Activation codes of the kernel's ``rnn_act`` (names as ``activation_specs`` gives them).
ACT_CODES = {
    "sigmoid": 0,
    "tanh": 1,
    "relu": 2,
    "affine": 3,
    "leakyrelu": 4,
    "thresholdedrelu": 5,
    "scaledtanh": 6,
    "hardsigmoid": 7,
    "elu": 8,
    "softsign": 9,
    "softplus": 10,
}
#: Element types the kernel writes (the projection and state are float32 for both).
ELEMENT_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float16): "__half"}
#: Activation slots per direction in the kernel's parameter table (LSTM's f, g, h).
ACT_SLOTS = 3

BODY = (
    f"#define RNN_MAX_HIDDEN {MAX_HIDDEN}\n"
    f"#define RNN_FAULT_SEQUENCE_LENGTH {error_flag.SEQUENCE_LENGTH}\n"
    r"""
// One thread per hidden unit: NVRTC must fit 1024 of them in a block (64 registers each).
#ifdef __CUDACC_RTC__
#define RNN_BOUNDS __launch_bounds__(RNN_MAX_HIDDEN)
#else
#define RNN_BOUNDS
#endif

__device__ __forceinline__ float rnn_f(float x) { return x; }
__device__ __forceinline__ float rnn_f(__half x) { return ix_h2f(x); }
template <typename T> __device__ __forceinline__ T rnn_out(float x);
template <> __device__ __forceinline__ float rnn_out<float>(float x) { return x; }
template <> __device__ __forceinline__ __half rnn_out<__half>(float x) { return ix_f2h(x); }

// The ONNX activations, by code (recurrence_cuda.ACT_CODES); sigmoid in its tanh form, which
// cannot overflow, as the generic kernel's.
__device__ __forceinline__ float rnn_act(int code, float a, float b, float x) {
  switch (code) {
    case 0: return 0.5f * (tanhf(0.5f * x) + 1.0f);
    case 1: return tanhf(x);
    case 2: return x > 0.0f ? x : 0.0f;
    case 3: return a * x + b;
    case 4: return x >= 0.0f ? x : a * x;
    case 5: return x > a ? x : 0.0f;
    case 6: return a * tanhf(b * x);
    case 7: { const float y = a * x + b; return y < 0.0f ? 0.0f : (y > 1.0f ? 1.0f : y); }
    case 8: return x >= 0.0f ? x : a * (expf(x) - 1.0f);
    case 9: return x / (1.0f + fabsf(x));
    default: return log1pf(expf(-fabsf(x))) + (x > 0.0f ? x : 0.0f);
  }
}

struct RnnAct {
  int code;
  float a, b;
  __device__ float operator()(float x) const { return rnn_act(code, a, b, x); }
};

__device__ __forceinline__ float rnn_clip(float x, int has_clip, float c) {
  if (!has_clip) return x;
  return x < -c ? -c : (x > c ? c : x);
}

__device__ __forceinline__ void rnn_put64(int* w, long long v) {
  const unsigned long long u = (unsigned long long)v;
  w[0] = (int)(unsigned int)(u & 0xffffffffull);
  w[1] = (int)(unsigned int)(u >> 32);
}

// One block per (direction, batch row), one thread per hidden unit. CELL: 0 RNN, 1 GRU,
// 2 LSTM. Gates per unit G: 1, 3 (z, r, h), 4 (i, o, f, c); xw is [rows, dirs*G*H] with
// row t*batch+b (layout 0) or b*steps+t (layout 1); rt is R^T, [dirs, H, G*H].
template <typename T, int CELL>
__global__ void RNN_BOUNDS rnn_seq(const float* __restrict__ xw, const T* __restrict__ rt,
                        const T* __restrict__ bias, const T* __restrict__ peep,
                        const T* __restrict__ h0, const T* __restrict__ c0,
                        const int* __restrict__ lens, const float* __restrict__ acts,
                        T* __restrict__ y, T* __restrict__ yh, T* __restrict__ yc, int* flag,
                        long long steps, long long batch, long long hidden, long long dirs,
                        long long reverse_mask, long long layout, long long has_clip,
                        double clip_value, long long flags, long long node) {
  __shared__ float h_sh[2][RNN_MAX_HIDDEN];
  __shared__ float rh_sh[RNN_MAX_HIDDEN];
  const int G = CELL == 0 ? 1 : (CELL == 1 ? 3 : 4);
  const long long d = blockIdx.x / batch, b = blockIdx.x - d * batch;
  const long long j = threadIdx.x;
  const bool active = j < hidden;
  const bool rev = (reverse_mask >> d) & 1;
  const long long H = hidden, GH = G * hidden;
  const int clip_on = (int)has_clip;
  const float cv = (float)clip_value;
  const bool input_forget = flags & 1, linear_before_reset = flags & 2;

  // A length outside [0, steps] is clamped (nothing is read past X) and recorded.
  long long len = steps;
  if (lens != nullptr) {
    const long long v = (long long)lens[b];
    len = v < 0 ? 0 : (v > steps ? steps : v);
    if (len != v && d == 0 && threadIdx.x == 0 && flag != nullptr &&
        ix_claim(flag)) {
      flag[1] = (int)node;
      flag[2] = 0;
      flag[3] = RNN_FAULT_SEQUENCE_LENGTH;
      rnn_put64(flag + 4, v);
      rnn_put64(flag + 6, b);
      rnn_put64(flag + 8, steps);
      rnn_put64(flag + 10, batch);
      rnn_put64(flag + 12, 0);
    }
  }

  RnnAct f, g, ha;
  {
    const float* p = acts + d * 9;
    f = RnnAct{(int)p[0], p[1], p[2]};
    g = RnnAct{(int)p[3], p[4], p[5]};
    ha = RnnAct{(int)p[6], p[7], p[8]};
  }
  const long long state_at = layout ? (b * dirs + d) * H + j : (d * batch + b) * H + j;
  float h = 0.0f, c = 0.0f;
  if (active) {
    if (h0 != nullptr) h = rnn_f(h0[state_at]);
    if (CELL == 2 && c0 != nullptr) c = rnn_f(c0[state_at]);
    h_sh[0][j] = h;
  }
  // The unit's biases (Wb + Rb, GRU's Rb_h apart) and peepholes, read once.
  float bw[4] = {0.0f, 0.0f, 0.0f, 0.0f}, brh = 0.0f, pi = 0.0f, po = 0.0f, pf = 0.0f;
  if (active && bias != nullptr) {
    const T* bd = bias + d * 2 * GH;
    for (int k = 0; k < G; ++k) {
      bw[k] = rnn_f(bd[k * H + j]);
      if (!(CELL == 1 && k == 2)) bw[k] += rnn_f(bd[GH + k * H + j]);
    }
    if (CELL == 1) brh = rnn_f(bd[GH + 2 * H + j]);
  }
  if (CELL == 2 && active && peep != nullptr) {
    const T* pd = peep + d * 3 * H;
    pi = rnn_f(pd[j]);
    po = rnn_f(pd[H + j]);
    pf = rnn_f(pd[2 * H + j]);
  }
  const T* r = rt + d * H * GH;
  const long long xrow = dirs * GH;

  for (long long s = 0; s < len; ++s) {
    const long long t = rev ? len - 1 - s : s;
    const float* hp = h_sh[s & 1];
    float* hn = h_sh[(s & 1) ^ 1];
    __syncthreads();  // h_{t-1} of every unit is in hp; last step's reads of hn are done
    const long long row = layout ? b * steps + t : t * batch + b;
    const float* x = xw + row * xrow + d * GH;
    if (CELL == 0) {
      if (active) {
        float a = x[j] + bw[0];
        for (long long k = 0; k < H; ++k) a += hp[k] * rnn_f(r[k * GH + j]);
        h = f(rnn_clip(a, clip_on, cv));
        hn[j] = h;
      }
    } else if (CELL == 2) {
      if (active) {
        float ai = x[j] + bw[0], ao = x[H + j] + bw[1], af = x[2 * H + j] + bw[2];
        float ac = x[3 * H + j] + bw[3];
        for (long long k = 0; k < H; ++k) {
          const float hk = hp[k];
          const T* rk = r + k * GH + j;
          ai += hk * rnn_f(rk[0]);
          ao += hk * rnn_f(rk[H]);
          af += hk * rnn_f(rk[2 * H]);
          ac += hk * rnn_f(rk[3 * H]);
        }
        ai += pi * c;
        af += pf * c;
        const float ig = f(rnn_clip(ai, clip_on, cv));
        const float fg = input_forget ? 1.0f - ig : f(rnn_clip(af, clip_on, cv));
        c = fg * c + ig * g(rnn_clip(ac, clip_on, cv));
        ao += po * c;
        const float og = f(rnn_clip(ao, clip_on, cv));
        h = og * ha(c);
        hn[j] = h;
      }
    } else {
      float z = 0.0f, rg = 0.0f, hh = 0.0f;
      if (active) {
        float az = 0.0f, ar = 0.0f;
        for (long long k = 0; k < H; ++k) {
          const float hk = hp[k];
          const T* rk = r + k * GH + j;
          az += hk * rnn_f(rk[0]);
          ar += hk * rnn_f(rk[H]);
          if (linear_before_reset) hh += hk * rnn_f(rk[2 * H]);
        }
        z = f(rnn_clip(x[j] + bw[0] + az, clip_on, cv));
        rg = f(rnn_clip(x[H + j] + bw[1] + ar, clip_on, cv));
        rh_sh[j] = rg * h;
      }
      if (!linear_before_reset) {
        __syncthreads();  // r * h of every unit is in rh_sh
        if (active) {
          for (long long k = 0; k < H; ++k) hh += rh_sh[k] * rnn_f(r[k * GH + 2 * H + j]);
          hh += brh;
        }
      } else {
        hh = rg * (hh + brh);
      }
      if (active) {
        const float n = g(rnn_clip(x[2 * H + j] + bw[2] + hh, clip_on, cv));
        h = (1.0f - z) * n + z * h;
        hn[j] = h;
      }
    }
    if (active && y != nullptr) {
      const long long at = layout ? ((b * steps + t) * dirs + d) * H + j
                                  : ((t * dirs + d) * batch + b) * H + j;
      y[at] = rnn_out<T>(h);
    }
  }
  if (!active) return;
  // Steps past the row's length: zeros (forward and reverse alike fill t >= len).
  if (y != nullptr) {
    for (long long t = len; t < steps; ++t) {
      const long long at = layout ? ((b * steps + t) * dirs + d) * H + j
                                  : ((t * dirs + d) * batch + b) * H + j;
      y[at] = rnn_out<T>(0.0f);
    }
  }
  // onnxruntime's final states of an empty sequence_lens row are zeros.
  const bool empty = lens != nullptr && len == 0;
  if (yh != nullptr) yh[state_at] = rnn_out<T>(empty ? 0.0f : h);
  if (CELL == 2 && yc != nullptr) yc[state_at] = rnn_out<T>(empty ? 0.0f : c);
}
"""
)
NAMES = tuple(
    index_cuda.template_name("rnn_seq", t, cell)
    for t in ELEMENT_TYPES.values()
    for cell, _ in CELLS.values()
)
SIGNATURE = "p" * 12 + "q" * 7 + "d" + "qq"


def act_table(node: NodeInfo, defaults: tuple[str, ...], dirs: int) -> np.ndarray:
    """``(code, alpha, beta)`` of each activation slot per direction, float32 ``[dirs * 9]``."""
    table = np.zeros((dirs, ACT_SLOTS, 3), dtype=np.float32)
    for d, per_dir in enumerate(activation_specs(node, defaults, dirs)):
        for k, (name, a, b) in enumerate(per_dir):
            table[d, k] = (ACT_CODES[name], a, b)
    return table.reshape(-1)


def _static_refusal(node: NodeInfo) -> str | None:
    """Why every run of this node goes to the generic kernel, known from its static types."""
    op = node.op_type
    x = node.inputs[0] if node.inputs else None
    dt = getattr(x, "dtype", None)
    if dt is not None and np.dtype(dt) not in ELEMENT_TYPES:
        return f"{op}: dtype {np.dtype(dt).name} (the recurrence kernel takes float32 and float16)"
    hidden = node.attr("hidden_size", None)
    if hidden is None and len(node.inputs) > 2 and node.inputs[2].shape is not None:
        hidden = node.inputs[2].shape[-1]
    if isinstance(hidden, int) and hidden > MAX_HIDDEN:
        return _hidden_refusal(op, hidden)
    return None


def _hidden_refusal(op: str, hidden: int) -> str:
    return (
        f"{op}: hidden_size {hidden} is past the {MAX_HIDDEN} units one block of the "
        "recurrence kernel takes (one thread per unit)"
    )


class Recurrence:
    """A built LSTM/GRU/RNN node on CUDA: ``run(X, W, R, B, lens, h0, c0, P)`` -> outputs."""

    def __init__(
        self,
        node: NodeInfo,
        xp: Any,
        device: Any,
        flag: error_flag.ErrorFlag,
        generic: Callable[..., tuple],
        defaults: tuple[str, ...],
    ) -> None:
        op = node.op_type
        self.op = op
        self.device = device
        self.generic = generic
        self.cell, self.gates = CELLS[op]
        direction = node.attr("direction", "forward")
        direction = direction.decode() if isinstance(direction, bytes) else str(direction)
        self.dirs = 2 if direction == "bidirectional" else 1
        self.reverse_mask = {"forward": 0, "reverse": 1, "bidirectional": 2}[direction]
        self.layout = int(node.attr("layout", 0))
        clip = node.attr("clip", None)
        self.clip = (0, 0.0) if clip is None else (1, float(clip))
        self.flags = int(bool(node.attr("input_forget", 0))) | 2 * int(
            bool(node.attr("linear_before_reset", 0))
        )
        # uploaded once, when the node is built: a run copies nothing from the host
        self.acts = xp.asarray(act_table(node, defaults, self.dirs))
        self.flag = flag
        self.flag_arg = device.address(flag.words)
        self.node_id = flag.register(op, node.name)
        self.kernels = device.kernels(BODY, NAMES, SIGNATURE)
        #: reason -> calls handed to the generic kernel at run time
        self.fallbacks: dict[str, int] = {}
        self.launches = 0

    def _fall_back(self, why: str, args: tuple) -> tuple:
        self.fallbacks[why] = self.fallbacks.get(why, 0) + 1
        return self.generic(*args)

    def __call__(self, X, W, R, B=None, lens=None, h0=None, c0=None, P=None) -> tuple:
        args = (X, W, R, B, lens, h0, c0, P)
        dev = self.device
        dt = np.dtype(X.dtype)
        if dt not in ELEMENT_TYPES or any(
            a is not None and np.dtype(a.dtype) != dt for a in (W, R, B, h0, c0, P)
        ):
            return self._fall_back(f"dtype {dt.name}", args)
        hidden = int(R.shape[-1])
        if hidden > MAX_HIDDEN:
            return self._fall_back(_hidden_refusal(self.op, hidden), args)
        if lens is not None and np.dtype(lens.dtype) != np.int32:
            return self._fall_back(f"sequence_lens of {np.dtype(lens.dtype).name}", args)
        self._check_shapes(X, W, R, B, lens, h0, c0, P, hidden)
        steps, batch = (X.shape[1], X.shape[0]) if self.layout else (X.shape[0], X.shape[1])
        dirs, gh = self.dirs, self.gates * hidden
        f32 = np.dtype(np.float32)
        y_shape = (batch, steps, dirs, hidden) if self.layout else (steps, dirs, batch, hidden)
        s_shape = (batch, dirs, hidden) if self.layout else (dirs, batch, hidden)
        if steps * batch == 0 or hidden == 0:
            return self.generic(*args)  # nothing to recur over: no launch to make
        y = dev.empty(y_shape, dt)
        yh = dev.empty(s_shape, dt)
        yc = dev.empty(s_shape, dt) if self.cell == 2 else None
        # [rows, input] @ [input, dirs*G*H], rows in X's order; float16 widened first
        x2 = dev.ascontiguous(X).reshape(steps * batch, X.shape[2])
        w2 = W.reshape(dirs * gh, W.shape[2])
        if dt != f32:
            x2, w2 = x2.astype(f32), w2.astype(f32)
        xw = project(x2, w2)
        rt = dev.ascontiguous(R.swapaxes(1, 2))  # [dirs, H, G*H]
        opt = [None if a is None else dev.ascontiguous(a) for a in (B, P, h0, c0, lens)]
        addr = [0 if a is None else dev.address(a) for a in opt]  # 0: a null pointer
        self.flag.shapes[self.node_id] = (batch,)
        launch = self.kernels[index_cuda.template_name("rnn_seq", ELEMENT_TYPES[dt], self.cell)]
        block = min(MAX_HIDDEN, -(-hidden // 32) * 32)
        launch(
            dirs * batch,
            block,
            (
                dev.address(xw),
                dev.address(rt),
                *addr[:4],
                addr[4],
                dev.address(self.acts),
                dev.address(y),
                dev.address(yh),
                0 if yc is None else dev.address(yc),
                self.flag_arg,
                steps,
                batch,
                hidden,
                dirs,
                self.reverse_mask,
                self.layout,
                self.clip[0],
                np.float64(self.clip[1]),
                self.flags,
                self.node_id,
            ),
            dev.stream(),
        )
        self.launches += 1
        return (y, yh) if yc is None else (y, yh, yc)

    def _check_shapes(self, X, W, R, B, lens, h0, c0, P, hidden) -> None:
        """The shapes the kernel's addressing assumes; a mismatch is the model's error."""
        from onnxep.errors import InvalidArgument

        op, dirs, g = self.op, self.dirs, self.gates
        if X.ndim != 3:
            raise InvalidArgument(f"{op}: X must be 3-D, got shape {list(X.shape)}")
        batch = X.shape[0] if self.layout else X.shape[1]
        state = (batch, dirs, hidden) if self.layout else (dirs, batch, hidden)
        want = {
            "W": (W, (dirs, g * hidden, X.shape[2])),
            "R": (R, (dirs, g * hidden, hidden)),
            "B": (B, (dirs, 2 * g * hidden)),
            "sequence_lens": (lens, (batch,)),
            "initial_h": (h0, state),
            "initial_c": (c0, state),
            "P": (P, (dirs, 3 * hidden)),
        }
        for name, (a, shape) in want.items():
            if a is not None and tuple(a.shape) != shape:
                raise InvalidArgument(
                    f"{op}: {name} must have shape {list(shape)}, got {list(a.shape)}"
                )


def build(
    node: NodeInfo,
    xp: Any,
    generic: Callable[..., tuple],
    defaults: tuple[str, ...],
) -> Callable[..., tuple]:
    """The run callable of an LSTM/GRU/RNN node on CUDA, or the generic one (with its note)."""
    why = _static_refusal(node)
    if why is not None:
        return not_capture_safe(generic, f"{why}; {CUPY_BLAS_NOTE}")
    device = index_cuda.device_for(xp)
    flag = error_flag.current()
    if device is None or flag is None:
        return generic
    return Recurrence(node, xp, device, flag, generic, defaults)


def project(x2: Any, w2: Any) -> Any:
    """``x2 @ w2^T`` (float32 or float16, 2-D) through the provider's capture-safe cuBLAS door;
    the emulated tests put NumPy's product here."""
    from .. import blas

    return blas.gemm(x2, w2, trans_b=True)
