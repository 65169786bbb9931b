"""What the tensor-core prefill's tests share between the GPU (tests/cuda) and the emulator.

* ``PROBE_SOURCE``: one-warp kernels that run each warp-level instruction the
  kernel uses (``mma16816``, ``ldsm_x4``/``ldsm_x4_t``, ``cp_async16``) on data
  gathered by the PTX ISA's fragment layouts, written out independently of
  the kernel, so the same probe checks the hardware (tests/cuda) and the
  emulator's host versions (tests/cuda_emulation.py) against NumPy: where
  both pass, the emulator follows the hardware;
* the GroupQueryAttention and Attention cases the kernel must run, and a
  direct launch of the kernel (``plan_flash_direct``) for bfloat16, which
  CuPy has no dtype for (its arrays travel as their uint16 bits).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from onnxep.providers.node import NodeInfo, ValueInfo
from onnxep.providers.ops.op_group_query_attention import group_query_attention as cpu_gqa
from onnxep.providers_cuda.ops._flash_cuda import FLASH_SOURCE

BF16 = np.dtype(ml_dtypes.bfloat16)
#: (atol, rtol) per dtype name: the kernel rounds probabilities to the input type before
#: P.V, as FlashAttention does, so bfloat16 gets its parity-kit tolerance.
TOL = {"float16": (2.5e-3, 1e-3), "bfloat16": (2e-2, 1e-2)}

PROBE_SOURCE = (
    FLASH_SOURCE
    + r"""
// d (16 x 8 float32, row-major) = a (16 x 16 row-major) * b (+ d when ACC), b given as its
// transpose bt (8 x 16 row-major); fragments gathered as the PTX ISA lays them out.
template <typename T, int ACC>
__global__ void __launch_bounds__(32) probe_mma(const T* a, const T* bt, float* d) {
  const int l = threadIdx.x, g = l >> 2, t = l & 3;
  unsigned af[4], bf[2];
  for (int r = 0; r < 4; ++r) {  // a_r: row g (+8 when r is odd), columns 2t, 2t+1 (+8 for r >= 2)
    const int row = g + 8 * (r & 1), col = 2 * t + 8 * (r >> 1);
    af[r] = bits_of(a[row * 16 + col]) | (bits_of(a[row * 16 + col + 1]) << 16);
  }
  for (int r = 0; r < 2; ++r) {  // b_r: rows (k) 2t, 2t+1 (+8 for r = 1) of column (n) g
    const int kk = 2 * t + 8 * r;
    bf[r] = bits_of(bt[g * 16 + kk]) | (bits_of(bt[g * 16 + kk + 1]) << 16);
  }
  float c[4];
  for (int i = 0; i < 4; ++i) c[i] = ACC ? d[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] : 0.f;
  mma16816<T>(c, af, bf[0], bf[1]);
  for (int i = 0; i < 4; ++i) d[(g + 8 * (i >> 1)) * 8 + 2 * t + (i & 1)] = c[i];
}

// A 16 x 16 tile staged in shared memory (rows of 24 elements); lane l addresses row
// (l & 7) + 8 ((l >> 3) & 1), column 8 (l >> 4); each lane writes the four words it got.
template <typename T, int TRANS>
__global__ void __launch_bounds__(32) probe_ldsm(const T* m, unsigned* out) {
  extern __shared__ float smem[];
  T* s = reinterpret_cast<T*>(smem);
  const int l = threadIdx.x;
  for (int i = l; i < 256; i += 32) s[(i / 16) * 24 + i % 16] = m[i];
  __syncthreads();
  unsigned r[4];
  const T* p = s + ((l & 7) + 8 * ((l >> 3) & 1)) * 24 + 8 * (l >> 4);
  if (TRANS) ldsm_x4_t(r, p); else ldsm_x4(r, p);
  for (int j = 0; j < 4; ++j) out[l * 4 + j] = r[j];
}

// 16-byte chunk l of src into shared memory when l < N, else zeros, then back out to dst
// (rotated by one chunk: each lane writes what another copied).
template <typename T, int N>
__global__ void __launch_bounds__(32) probe_cp_async(const T* src, T* dst) {
  extern __shared__ float smem[];
  T* s = reinterpret_cast<T*>(smem);
  const int l = threadIdx.x, per = 16 / (int)sizeof(T);
  cp_async16(s + l * per, src + (l < N ? l : 0) * per, l < N);
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();
  for (int i = 0; i < per; ++i) dst[l * per + i] = s[((l + 1) % 32) * per + i];
}
"""
)
PROBE_TYPES = {"float16": "__half", "bfloat16": "bf16_t"}


def probe_inputs(dtype: str, rng):
    """(a, bt, d0) for probe_mma: small integers, so every product is exact."""
    dt = BF16 if dtype == "bfloat16" else np.dtype(np.float16)
    a = rng.integers(-8, 9, (16, 16)).astype(dt)
    bt = rng.integers(-8, 9, (8, 16)).astype(dt)
    d0 = rng.integers(-50, 51, (16, 8)).astype(np.float32)
    return a, bt, d0


def mma_expected(a, bt, d0, acc: bool = True):
    return (d0 if acc else 0) + a.astype(np.float32) @ bt.astype(np.float32).T


def ldsm_expected(m: np.ndarray, trans: bool) -> np.ndarray:
    """The PTX ISA's ldmatrix distribution of a 16 x 16 tile of 16-bit values, as uint32."""
    bits = m.view(np.uint16).astype(np.uint32)
    # matrix j: rows 8 (j & 1).., columns 8 (j >> 1).. (lanes 8j..8j+7 address its rows)
    mats = [bits[8 * (j & 1) : 8 * (j & 1) + 8, 8 * (j >> 1) : 8 * (j >> 1) + 8] for j in range(4)]
    out = np.zeros((32, 4), np.uint32)
    for lane in range(32):
        for j, mat in enumerate(mats):
            if trans:
                lo, hi = mat[2 * (lane % 4), lane // 4], mat[2 * (lane % 4) + 1, lane // 4]
            else:
                lo, hi = mat[lane // 4, 2 * (lane % 4)], mat[lane // 4, 2 * (lane % 4) + 1]
            out[lane, j] = lo | (hi << 16)
    return out


def cp_async_expected(src: np.ndarray, n: int) -> np.ndarray:
    per = 16 // src.itemsize
    chunks = src.reshape(32, per).copy()
    chunks[n:] = 0
    return np.roll(chunks, -1, axis=0).reshape(-1)


# ------------------------------------------------------------------------ GroupQueryAttention

#: name, b, s, nh, nkv, hd, past lens, capacity, attrs, extras (tests/cuda/test_cuda_attention's
#: ``_gqa_feeds`` conventions: a first prompt is right-padded, rows 1.. shorter: ragged)
GQA_CASES = [
    ("h64_causal_g7_ragged_packed_rotary", 3, 70, 7, 1, 64, [0, 0, 0], None, {"do_rotary": 1},
     ("packed",)),
    ("h64_bidirectional_g2_ragged", 2, 40, 4, 2, 64, [0, 0], None, {"causal": 0}, ()),
    ("h128_causal_g1", 2, 33, 2, 2, 128, [0, 0], None, {}, ()),
    ("h128_bidirectional_g2", 1, 24, 2, 1, 128, [0], None, {"causal": 0}, ()),
    ("h256_causal_g2", 1, 40, 2, 1, 256, [0], None, {}, ()),
    ("h256_bidirectional_g1_ragged", 2, 20, 1, 1, 256, [0, 0], None, {"causal": 0}, ()),
    ("h64_chunk_after_past_shared", 2, 20, 4, 2, 64, [45, 70], 96, {"do_rotary": 1}, ()),
    ("h32_window_softcap_scale", 2, 50, 4, 2, 32, [0, 0], None,
     {"local_window_size": 7, "softcap": 2.0, "scale": 0.3}, ()),
    ("h16_bias_sink", 2, 30, 4, 2, 16, [0, 0], None, {}, ("attention_bias", "head_sink")),
    ("h48_smooth_query_seqlens", 2, 11, 4, 2, 48, [3, 5], 24, {"smooth_softmax": 1},
     ("query_seqlens",)),
    ("h80_position_ids_il", 2, 14, 4, 2, 80, [0, 0], None,
     {"do_rotary": 1, "rotary_interleaved": 1}, ("position_ids", "half_rot")),
    ("h160_g7_fresh_cache", 1, 20, 7, 1, 160, [6], None, {}, ()),
]  # fmt: skip


def gqa_node(name, nh, nkv, attrs, feeds, names):
    attrs = {"num_heads": nh, "kv_num_heads": nkv, **attrs}
    ins = tuple(ValueInfo(n, "tensor", feeds[n].dtype, feeds[n].shape) if n else None
                for n in names)  # fmt: skip
    outs = tuple(ValueInfo(n, "tensor") for n in ("output", "present_key", "present_value"))
    return NodeInfo("GroupQueryAttention", "com.microsoft", name, 1, attrs, ins, outs)


# ---------------------------------------------------------------------------- ONNX Attention

#: tests/cuda/test_cuda_attention23's case format: name, attrs, opset, dtype, Q, K, V shapes,
#: extras (("mask", shape, kind), ("past", length), ("nonpad", lengths))
F16 = np.float16
ATTENTION_CASES = [
    ("4d_causal_h64_gqa", {"is_causal": 1}, 23, F16, (2, 4, 70, 64), (2, 2, 70, 64),
     (2, 2, 70, 64), ()),
    ("3d_gqa7_h32_softcap_scale", {"q_num_heads": 7, "kv_num_heads": 1, "softcap": 3.0,
                                   "scale": 0.2}, 23, F16, (1, 33, 224), (1, 33, 32),
     (1, 33, 32), ()),
    ("bool_mask_h16", {}, 23, F16, (2, 2, 20, 16), (2, 2, 37, 16), (2, 2, 37, 16),
     (("mask", (20, 37), "bool"),)),
    ("float_mask_causal_h128", {"is_causal": 1}, 23, F16, (1, 2, 24, 128), (1, 2, 24, 128),
     (1, 2, 24, 128), (("mask", (1, 2, 24, 24), "float32"),)),
    ("half_mask_past_h64", {"is_causal": 1}, 23, F16, (1, 2, 20, 64), (1, 2, 20, 64),
     (1, 2, 20, 64), (("mask", (1, 1, 20, 50), "float16"), ("past", 30))),
    ("mask_narrower_than_keys_h32", {}, 23, F16, (1, 2, 17, 32), (1, 2, 40, 32),
     (1, 2, 40, 32), (("mask", (17, 29), "float16"),)),
    ("nonpad_causal_h64", {"is_causal": 1}, 24, F16, (2, 2, 40, 64), (2, 2, 60, 64),
     (2, 2, 60, 64), (("nonpad", [60, 25]),)),
    ("windows_both_h256", {"left_window_size": 9, "right_window_size": 4}, 25, F16,
     (1, 1, 40, 256), (1, 1, 40, 256), (1, 1, 40, 256), ()),
    ("fully_masked_rows_h16", {}, 23, F16, (1, 2, 2, 16), (1, 2, 3, 16), (1, 2, 3, 16),
     (("mask", (2, 3), "none_in_row_0"),)),
]  # fmt: skip


# -------------------------------------------------------------------- direct launches (bf16)

#: name, b, s, nh, nkv, hd, causal, ragged (rows 1.. of the batch shorter)
DIRECT_CASES = [
    ("h64_g7_causal_ragged", 2, 70, 7, 1, 64, True, True),
    ("h128_g2_bidirectional", 1, 40, 4, 2, 128, False, False),
    ("h256_g1_causal", 1, 36, 2, 2, 256, True, False),
    ("h96_g2_bidirectional_ragged", 2, 33, 2, 1, 96, False, True),
]


def direct_feeds(case, dtype, rng):
    """GroupQueryAttention-style inputs of one direct case: (q, k, v) as (B, S, heads * D) in
    ``dtype`` (rounded there), and ``seqlens_k`` (right-padded prompts)."""
    _, b, s, nh, nkv, hd, _, ragged = case
    q = rng.standard_normal((b, s, nh * hd)).astype(dtype)
    k = rng.standard_normal((b, s, nkv * hd)).astype(dtype)
    v = rng.standard_normal((b, s, nkv * hd)).astype(dtype)
    lens = [s] + [int(rng.integers(1, s + 1)) if ragged else s for _ in range(b - 1)]
    return q, k, v, np.array(lens, np.int32) - 1


def direct_expected(case, q, k, v, seqlens):
    """The CPU GroupQueryAttention kernel on the float32 values of the inputs."""
    name, b, s, nh, nkv, hd, causal, _ = case
    f = {"query": q.astype(np.float32), "key": k.astype(np.float32),
         "value": v.astype(np.float32), "seqlens_k": seqlens,
         "total_sequence_length": np.array(s, np.int32)}  # fmt: skip
    names = ["query", "key", "value", "", "", "seqlens_k", "total_sequence_length"]
    node = gqa_node(name, nh, nkv, {"causal": int(causal)}, f, names)
    return cpu_gqa(node, np)(*[f[n] if n else None for n in names])[0]


def plan_flash_direct(kernels, xp, case, dtype, tiles=None):
    """The kernel's launcher for a direct case: Q as (B, Hq, S, D), K/V as (B, Hkv, S, D)
    caches of capacity S, Y as (B, S, Hq * D); ``tiles`` m16 tiles per warp (None: the
    plan's choice for 8 SMs)."""
    from onnxep.providers_cuda.ops import _flash_prefill as fp

    _, b, s, nh, nkv, hd, causal, _ = case
    kv = (nkv * s * hd, s * hd, hd)
    return fp.plan(
        kernels, xp, dtype, b=b, nh=nh, nkv=nkv, d=hd, sq=s, sk=s,
        q_strides=(nh * s * hd, s * hd, hd), k_strides=kv, v_strides=kv,
        y_strides=(s * nh * hd, hd, nh * hd), mode=fp.MODE_GQA, causal=causal,
        scale=float(1 / np.sqrt(hd)), kv_limit=s, sms=8, tiles=tiles,
    )  # fmt: skip


def heads_first(x: np.ndarray, heads: int) -> np.ndarray:
    """(B, S, heads * D) -> contiguous (B, heads, S, D)."""
    b, s, w = x.shape
    return np.ascontiguousarray(x.reshape(b, s, heads, w // heads).transpose(0, 2, 1, 3))
