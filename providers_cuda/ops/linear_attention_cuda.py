"""The recurrent LinearAttention kernel (both domains) and its launch geometry.

One launch runs a whole step, decode or prefill: a block owns one
(batch, KV head, tile of CB state columns) and walks the tokens in order.
Columns of the state S (d_k x d_v) evolve independently (every rule updates
column j from k, the decay, beta and v[j] alone), so a column's d_k rows are
split over P lanes of one warp (P a power of two, rows p, p + P, ... in
registers, LA_ROWS at most each) and the two dot products a token needs
(S^T k for the delta rules, S^T q per query head) are sums over those P
lanes by xor shuffles: no barrier per token. Tokens are staged in shared
memory TT at a time (k, the group's q heads, exp(decay), beta, and v of the
block's columns), two barriers per TT tokens.

The state is read once through a shared tile (coalesced rows of CB columns)
and written the same way after the last token, or after each token a state
window keeps. A block reads all of its tile before writing any of it, and no
two blocks share a tile, so the kernel is also correct with ``present`` the
same buffer as ``past`` (no ``__restrict__`` on them).

Per token, for a thread's column j (the CPU kernels' order,
``providers/ops/op_linear_attention.py`` and ``op_onnx_linear_attention.py``):
``S *= exp(g)`` (gated rules, per head or per key row), ``u = beta * (v[j] -
(S^T k)[j])`` (delta rules; else ``u = v[j]``), ``S += k u^T``, and each of
the group's query heads g writes ``y = scale * (S^T q_g)[j]``.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import reduce_cuda as K
from .hybrid_cuda import HYBRID_COMMON

#: State rows one thread keeps in registers; d_k up to 32 * LA_ROWS fits a warp's lanes.
LA_ROWS = 16
MAX_DK = 32 * LA_ROWS
#: Most threads of a block, and fewest state columns a block's tile has (where it can).
LA_THREADS = 128
MIN_COLUMNS = 8
#: Floats of the shared state tile: d_k rows of CB + 1 (padded) columns, d_k <= P * LA_ROWS.
LA_TILE = LA_ROWS * LA_THREADS + 32 * LA_ROWS
#: Floats of the shared token stage, and the most tokens staged at once.
LA_STAGE = 6144
LA_MAX_TOKENS = 32

LA_BODY = (
    f"#define LA_ROWS {LA_ROWS}\n#define LA_TILE {LA_TILE}\n#define LA_STAGE {LA_STAGE}\n"
    + HYBRID_COMMON
    + r"""
// Sum over the P lanes (a power of two <= 32, aligned in the warp) that share a state column;
// every one of them gets it. Every lane of the warp takes part.
__device__ __forceinline__ float group_sum(float v, int P) {
  for (int o = P >> 1; o > 0; o >>= 1) v += shfl_xor(v, o);
  return v;
}

// Write the block's tile of the state (rows i = p + P * r of column col in s) at dst + at:
// through the shared tile, so each row of CB columns is stored contiguously.
__device__ __forceinline__ void la_store_state(void* dst, i64 at, const float* s, float* tile,
                                               int dk, int dv, int j0, int CB, int col, int p,
                                               int P, int half) {
  const int ts = CB + 1;
  __syncthreads();  // whoever read the tile before is done with it
#pragma unroll
  for (int r = 0; r < LA_ROWS; ++r) {
    const int i = p + P * r;
    if (i < dk) tile[i * ts + col] = s[r];
  }
  __syncthreads();
  for (int e = threadIdx.x; e < dk * CB; e += blockDim.x) {
    const int i = e / CB, c = e % CB;
    if (j0 + c < dv) st(dst, at + (i64)i * dv + j0 + c, tile[i * ts + c], half);
  }
}

// Tokens t0 .. t0 + n - 1 staged at stage, F floats each (k at 0, the G query heads at fq,
// exp(decay) at fg when gated, beta at fb when delta, v at fv): each token's update of the
// thread's rows s of state column j, y for the group's query heads, and the state slots a
// window keeps.
__device__ __forceinline__ void la_tokens(float* s, float* tile, const float* stage, int F,
                                          int fq, int fg, int fb, int fv, int n, i64 t0, i64 T,
                                          i64 b, int h, int hkv, int G, int gw, int gated,
                                          int delta, int dk, int dv, int j0, int j, int CB,
                                          int col, int p, int P, float scale, void* y, int yhalf,
                                          void* present, int window, i64 slot, i64 head,
                                          int qhalf) {
  for (int tt = 0; tt < n; ++tt) {
    const float* tok = stage + tt * F;
    const i64 t = t0 + tt;
    float kr[LA_ROWS];
#pragma unroll
    for (int r = 0; r < LA_ROWS; ++r) {
      const int i = p + P * r;
      kr[r] = i < dk ? tok[i] : 0.f;
    }
    if (gated) {
#pragma unroll
      for (int r = 0; r < LA_ROWS; ++r) {
        const int i = p + P * r;
        const float e = gw == 1 ? tok[fg] : (i < dk ? tok[fg + i] : 0.f);
        s[r] = __fmul_rn(s[r], e);
      }
    }
    const float vj = tok[fv + col];
    float u = vj;
    if (delta) {
      float part = 0.f;
#pragma unroll
      for (int r = 0; r < LA_ROWS; ++r) part += __fmul_rn(kr[r], s[r]);
      u = __fmul_rn(tok[fb], vj - group_sum(part, P));
    }
#pragma unroll
    for (int r = 0; r < LA_ROWS; ++r) s[r] += __fmul_rn(kr[r], u);
    for (int g = 0; g < G; ++g) {
      const float* qg = tok + fq + g * dk;
      float part = 0.f;
#pragma unroll
      for (int r = 0; r < LA_ROWS; ++r) {
        const int i = p + P * r;
        if (i < dk) part += __fmul_rn(qg[i], s[r]);
      }
      const float o = group_sum(part, P);
      if (p == 0 && j < dv) {
        st(y, ((b * T + t) * hkv * G + (i64)h * G + g) * dv + j, __fmul_rn(o, scale),
           yhalf);
      }
    }
    if (window > 0 && t >= T - window) {
      la_store_state(present, (window - T + t) * slot + head, s, tile, dk, dv, j0, CB, col, p,
                     P, qhalf);
    }
  }
}

// The start of a block's walk: each thread's rows s of its state column from past (zeros
// without one), through the shared tile, and present's slots before the first token zeroed.
__device__ __forceinline__ void la_begin(float* s, float* tile, const void* past, void* present,
                                         i64 past_off, i64 head, i64 slot, i64 T, int window,
                                         int dk, int dv, int j0, int CB, int col, int p, int P,
                                         int past_half, int qhalf) {
  const int tid = threadIdx.x, nt = blockDim.x, ts = CB + 1;
  for (int e = tid; e < dk * CB; e += nt) {
    const int i = e / CB, c = e % CB;
    float val = 0.f;
    if (past != nullptr && j0 + c < dv) {
      val = ld(past, past_off + head + (i64)i * dv + j0 + c, past_half);
    }
    tile[i * ts + c] = val;
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < LA_ROWS; ++r) {
    const int i = p + P * r;
    s[r] = i < dk ? tile[i * ts + col] : 0.f;
  }
  for (i64 sl = 0; sl < (i64)window - T; ++sl) {  // slots before the first token: zeros
    for (int e = tid; e < dk * CB; e += nt) {
      const int i = e / CB, c = e % CB;
      if (j0 + c < dv) st(present, sl * slot + head + (i64)i * dv + j0 + c, 0.f, qhalf);
    }
  }
}

// LinearAttention for one (batch b, KV head h, tile of CB state columns from j0) per block;
// blockDim.x == P * CB, thread t owns column t / P and rows t % P + P * r.
// q (B, T, hq * dk): the group's query heads are (h * G + g) / qdiv; k (B, T, nk * dk): key
// head h / kdiv; v (B, T, hkv * dv); decay (B, T, hkv * gw), gw 1 or dk; beta (B, T, bw),
// bw 1 or hkv; past (B, hkv, dk, dv) from element past_off, or null for zeros. y
// (B, T, hkv * G * dv): head h * G + g. present: `window` slots (1 when window == 0) of
// (B, hkv, dk, dv): slot window - T + t holds the state after token t, earlier slots zeros.
// types bits: 0 q, 1 k, 2 v, 3 past, 4 decay, 5 beta, 6 y, 7 present.
__global__ void linear_attention(const void* q, const void* k, const void* v, const void* past,
                                 const void* decay, const void* beta, void* y, void* present,
                                 i64 B, i64 T, int hq, int hkv, int nk, int dk, int dv, int G,
                                 int qdiv, int kdiv, int gw, int bw, int P, int CB, int TT,
                                 int window, i64 past_off, float scale, int gated, int delta,
                                 int types) {
  __shared__ float tile[LA_TILE];
  __shared__ float stage[LA_STAGE];
  const int tid = threadIdx.x, nt = blockDim.x;
  const int col = tid / P, p = tid % P;
  const int tiles = (dv + CB - 1) / CB;
  const int j0 = (int)(blockIdx.x % tiles) * CB;
  const i64 bh = (i64)blockIdx.x / tiles;
  const int h = (int)(bh % hkv);
  const i64 b = bh / hkv;
  const int j = j0 + col;
  const i64 head = bh * dk * dv;  // (b * hkv + h) * dk * dv: this head's state in a slot
  const i64 slot = B * hkv * dk * dv;

  float s[LA_ROWS];
  const int qhalf = HALF(types, 7);
  la_begin(s, tile, past, present, past_off, head, slot, T, window, dk, dv, j0, CB, col, p, P,
           HALF(types, 3), qhalf);

  // One staged token: k at 0, the G query heads at fq, exp(decay) at fg, beta at fb, v at fv.
  const int fq = dk, fg = fq + G * dk, fb = fg + (gated ? gw : 0), fv = fb + (delta ? 1 : 0);
  const int F = fv + CB;
  const int kh = h / kdiv;
  for (i64 t0 = 0; t0 < T; t0 += TT) {
    const int n = (int)(T - t0 < TT ? T - t0 : TT);
    const i64 bt0 = b * T + t0;
    __syncthreads();  // the previous tokens are done with the stage
    for (int e = tid; e < n * dk; e += nt) {
      const int tt = e / dk, i = e % dk;
      stage[tt * F + i] = ld(k, ((bt0 + tt) * nk + kh) * dk + i, HALF(types, 1));
    }
    for (int e = tid; e < n * G * dk; e += nt) {
      const int tt = e / (G * dk), r = e % (G * dk);
      const int qh = (h * G + r / dk) / qdiv;
      stage[tt * F + fq + r] = ld(q, ((bt0 + tt) * hq + qh) * dk + r % dk, HALF(types, 0));
    }
    if (gated) {
      for (int e = tid; e < n * gw; e += nt) {
        const int tt = e / gw, i = e % gw;
        stage[tt * F + fg + i] = expf(ld(decay, ((bt0 + tt) * hkv + h) * gw + i, HALF(types, 4)));
      }
    }
    if (delta) {
      for (int e = tid; e < n; e += nt) {
        stage[e * F + fb] = ld(beta, (bt0 + e) * bw + (bw == 1 ? 0 : h), HALF(types, 5));
      }
    }
    for (int e = tid; e < n * CB; e += nt) {
      const int tt = e / CB, c = e % CB;
      float val = 0.f;
      if (j0 + c < dv) val = ld(v, ((bt0 + tt) * hkv + h) * dv + j0 + c, HALF(types, 2));
      stage[tt * F + fv + c] = val;
    }
    __syncthreads();
    la_tokens(s, tile, stage, F, fq, fg, fb, fv, n, t0, T, b, h, hkv, G, gw, gated, delta, dk, dv,
              j0, j, CB, col, p, P, scale, y, HALF(types, 6), present, window, slot, head, qhalf);
  }
  if (window == 0) la_store_state(present, head, s, tile, dk, dv, j0, CB, col, p, P, qhalf);
}
"""
)

LA_NAMES = ("linear_attention",)


def la_kernel():
    """The compiled kernel (once per process)."""
    return K.compile_kernels(LA_BODY, LA_NAMES)["linear_attention"]


@dataclass(frozen=True)
class LaGeometry:
    """How one input signature is launched: P lanes per state column, CB columns per block,
    TT tokens staged at once."""

    lanes: int  # P
    columns: int  # CB
    tokens: int  # TT
    grid: int
    block: int


def _pow2_at_least(v: int) -> int:
    return 1 << max(0, int(v) - 1).bit_length()


def la_geometry(
    batch: int,
    hkv: int,
    dk: int,
    dv: int,
    group: int,
    decay_width: int,
    gated: bool,
    delta: bool,
    sms: int,
) -> LaGeometry | str:
    """The launch for these sizes, or the reason the kernel cannot take them."""
    if dk > MAX_DK:
        return f"head size d_k {dk} is above the CUDA kernel's {MAX_DK}"
    lanes = _pow2_at_least(-(-dk // LA_ROWS))
    # A block is at least one whole warp, and a tile row at least MIN_COLUMNS state values
    # (a whole 32-byte sector of float32) where the block size allows.
    min_cols = min(max(32 // lanes, MIN_COLUMNS), LA_THREADS // lanes)
    cols = max(min_cols, min(LA_THREADS // lanes, _pow2_at_least(max(dv, 1))))

    def blocks(c: int) -> int:
        return batch * hkv * -(-dv // c)

    # Narrower tiles (more blocks) while the heads alone leave SMs idle: decode is a
    # handful of heads.
    while cols > min_cols and blocks(cols) < sms:
        cols //= 2
    per_token = dk * (1 + group) + (decay_width if gated else 0) + (1 if delta else 0) + cols
    if per_token > LA_STAGE:
        return (
            f"one token's staged operands ({per_token} floats: d_k {dk} times {group} query "
            f"heads per KV head, plus k, decay, beta, v) exceed the kernel's {LA_STAGE}"
        )
    grid = blocks(cols)
    if grid > K.MAX_GRID:
        return f"{grid} blocks exceed the CUDA grid limit"
    tokens = min(LA_MAX_TOKENS, LA_STAGE // per_token)
    return LaGeometry(lanes, cols, tokens, grid, lanes * cols)
