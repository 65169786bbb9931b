"""CUDA C for MatMulNBits: the fused dequantise-GEMV, the dequantiser for the GEMM path, and
the int8 rounding of activations that ``accuracy_level=4`` asks for; plus the launch plans.

Weight layout the kernels read (built once by the op module from the constant
initializers): B as ``(N, RS)`` bytes, each row the node's packed row (blocks
of ``block_size`` values along K, ``8 / bits`` values per byte, low bits
first) cut or zero-padded to ``RS = 16 * C`` bytes, ``C = ceil(K / VPC)`` 16-byte
chunks of ``VPC = 128 / bits`` values; scales ``(N, KB)``; packed uint8 zero
points ``(N, ZS)`` as the node gives them, or float zero points as float32
``(N, KB)``. Values past K in the last chunk meet zero activations.

GEMV (M <= 8 rows of A). A task is ``R`` consecutive output columns; ``G``
lanes (a power of two) share a task and walk its chunks ``c = lane, lane + G,
...``, so the lanes of a task read consecutive 16-byte chunks (coalesced),
each lane keeping four row-chunks in flight (the next ``4 / r`` chunks)
while it computes the current one. Each
thread block copies A's rows (as float32, zero past K) into shared memory
while its first weight loads are in flight, swizzled so the lanes reading
neighbouring chunks hit different banks; one copy serves every task the
block walks (a grid-stride loop), or, when K is too long for the
shared-memory budget, A is staged one segment of chunks at a time. When the
tasks alone leave the device short (narrow N, long K: a down projection),
the chunks are split across blocks too: each split writes float32 partials, and the last
of the splits of a block's tasks to finish (an integer ticket per block of a split, in a
buffer the node allocates once and the merging block puts back to zero, so CUDA graph
replays find it zeroed) adds them in split order (bit-stable, no float atomics), adds the
bias and rounds once: one launch. A 32-bit word of weights becomes floats with byte
permutes (``2^23 + q``), minus ``2^23 + zero_point``: exact ``q - zp``. Products are
accumulated in float32 per quantization block and scaled once per block; the ``G`` partial
sums of a task meet by warp shuffles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .quant_cuda import PRELUDE, pow2_ceil

#: GEMV handles up to this many rows of A; more go through dequantise + cuBLAS.
GEMV_MAX_M = 8
#: Threads per block of the GEMV and dequantiser kernels.
BLOCK_THREADS = 256
#: Shared memory the GEMV may use for A (bytes): small enough for several blocks per SM.
SMEM_BUDGET = 32 * 1024
#: Threads of the GEMV resident per SM: its launch bounds ask for two blocks of 256.
RESIDENT_THREADS_PER_SM = 2 * BLOCK_THREADS
#: Fewest chunks of a split each lane of a task walks (the loads it keeps in flight).
MIN_SPLIT_CHUNKS = 2
#: Relative instructions per weight byte by columns per task (A re-read per column).
_R_COST = {4: 1.0, 2: 1.07, 1: 1.2}
#: Zero-point kinds (template parameter ZP).
ZP_NONE, ZP_PACKED, ZP_FLOAT = 0, 1, 2

SOURCE = (
    PRELUDE
    + r"""
namespace oq {

__device__ __forceinline__ int swz(int s) { return s ^ ((s >> 3) & 7); }

template <typename T> __device__ __forceinline__ T zero_of();
template <> __device__ __forceinline__ float zero_of<float>() { return 0.f; }
template <> __device__ __forceinline__ __half zero_of<__half>() { return __float2half_rn(0.f); }

__device__ __forceinline__ unsigned word_of(const uint4& w, int j) {
  return j == 0 ? w.x : (j == 1 ? w.y : (j == 2 ? w.z : w.w));
}

// A[m][k_base + 4s .. +4) as float4 slot swz(s) of row m, for MT rows (rows past M
// repeat row M - 1; their results are dropped) and zeros past K.
template <typename TA>
__device__ __forceinline__ void stage_a(const TA* __restrict__ a, float4* __restrict__ sa,
                                        int M, int K, int k_base, int slots, int mt) {
  const int total = mt * slots;
  for (int i = threadIdx.x; i < total; i += blockDim.x) {
    const int m = i / slots;
    const int s = i - m * slots;
    const TA* row = a + (long long)min(m, M - 1) * K;
    const int k = k_base + 4 * s;
    float v[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) v[t] = (k + t < K) ? to_float<TA>(row[k + t]) : 0.f;
    sa[m * slots + swz(s)] = make_float4(v[0], v[1], v[2], v[3]);
  }
}

// The block (along K) of word group jb of chunk c.
template <int BLOCK, int BPC, int VPC>
__device__ __forceinline__ int block_of(int c, int jb) {
  return BPC == 1 ? (c * VPC) / BLOCK : c * BPC + jb;
}

template <typename TS, int BITS, int BLOCK, int ZP, int R, int BPC, int VPC>
__device__ __forceinline__ void load_chunk(
    int c, int n0, int N, int KB, int RS, int ZS, const unsigned char* __restrict__ b,
    const TS* __restrict__ scales, const unsigned char* __restrict__ zp8,
    const float* __restrict__ zpf, uint4 (&w)[R], TS (&s)[R][BPC], unsigned (&z)[R][BPC],
    float (&zf)[R][BPC]) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const long long nr = min(n0 + r, N - 1);
    w[r] = __ldg(reinterpret_cast<const uint4*>(b + nr * RS) + c);
#pragma unroll
    for (int jb = 0; jb < BPC; ++jb) {
      const int kb = block_of<BLOCK, BPC, VPC>(c, jb);
      const bool ok = kb < KB;  // a chunk may run past the last block (only with BPC > 1)
      s[r][jb] = ok ? scales[nr * KB + kb] : zero_of<TS>();
      if constexpr (ZP == 1) z[r][jb] = ok ? (unsigned)zp8[nr * ZS + ((kb * BITS) >> 3)] : 0u;
      if constexpr (ZP == 2) zf[r][jb] = ok ? zpf[nr * KB + kb] : 0.f;
    }
  }
}

template <typename TS, int BITS, int BLOCK, int ZP, int R, int MT, int BPC, int VPC>
__device__ __forceinline__ void compute_chunk(
    int c, int rel, const float4* __restrict__ sa, int slots, const uint4 (&w)[R],
    const TS (&s)[R][BPC], const unsigned (&z)[R][BPC], const float (&zf)[R][BPC],
    float (&acc)[MT][R]) {
  constexpr int VPW = 32 / BITS;
  constexpr int WPB = 4 / BPC;   // words of the chunk in one block
  constexpr int SPW = VPW / 4;   // float4 slots of A per word
  constexpr unsigned ZMASK = (1u << BITS) - 1u;
#pragma unroll
  for (int jb = 0; jb < BPC; ++jb) {
    const int kb = block_of<BLOCK, BPC, VPC>(c, jb);
    float off[R], sc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      sc[r] = to_float<TS>(s[r][jb]);
      if constexpr (ZP == 0) off[r] = 8388608.0f + (float)(1 << (BITS - 1));
      if constexpr (ZP == 1)
        off[r] = __uint_as_float(0x4B000000u | ((z[r][jb] >> ((kb * BITS) & 7)) & ZMASK));
      if constexpr (ZP == 2) off[r] = 8388608.0f;
    }
    float part[MT][R];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r) part[m][r] = 0.f;
#pragma unroll
    for (int jw = 0; jw < WPB; ++jw) {
      const int j = jb * WPB + jw;
      float d[R][VPW];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        unpack_word<BITS>(word_of(w[r], j), off[r], d[r]);
        if constexpr (ZP == 2) {
#pragma unroll
          for (int i = 0; i < VPW; ++i) d[r][i] -= zf[r][jb];
        }
      }
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        float av[VPW];
#pragma unroll
        for (int t = 0; t < SPW; ++t) {
          const float4 v = sa[m * slots + swz(rel * VPW + j * SPW + t)];
          av[4 * t] = v.x;
          av[4 * t + 1] = v.y;
          av[4 * t + 2] = v.z;
          av[4 * t + 3] = v.w;
        }
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int i = 0; i < VPW; ++i) part[m][r] = fmaf(av[i], d[r][i], part[m][r]);
      }
    }
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r) acc[m][r] = fmaf(sc[r], part[m][r], acc[m][r]);
  }
}

}  // namespace oq

// y[m, n] = sum_k a[m, k] * (q[n, k] - zp[n, k / BLOCK]) * scale[n, k / BLOCK] (+ bias[n])
template <typename TA, typename TS, typename TO, int BITS, int BLOCK, int ZP, int R, int MT>
__global__ void __launch_bounds__(256, 2) nbits_gemv(
    const TA* __restrict__ a, const unsigned char* __restrict__ b, const TS* __restrict__ scales,
    const unsigned char* __restrict__ zp8, const float* __restrict__ zpf,
    const TO* __restrict__ bias, TO* __restrict__ y, float* part, int* __restrict__ done, int M,
    int N, int K, int KB, int RS, int ZS, int C, int log2g, int seg_chunks, int has_bias, int bps,
    int cps) {
  using namespace oq;
  constexpr int VPW = 32 / BITS;
  constexpr int VPC = 4 * VPW;
  constexpr int BPC = BLOCK >= VPC ? 1 : VPC / BLOCK;
  constexpr int P = R >= 4 ? 1 : 4 / R;  // chunks each lane has in flight ahead
  extern __shared__ float4 oq_smem_a[];
  __shared__ int oq_last;

  const int G = 1 << log2g;
  const int lane_g = threadIdx.x & (G - 1);
  const int group = threadIdx.x >> log2g;
  const int groups = blockDim.x >> log2g;
  const int tasks = (N + R - 1) / R;
  const int slots = seg_chunks * VPW;  // float4 slots per staged row (a multiple of 8)
  // Block i walks tasks with the blocks of its split i / bps, over chunks [c_lo, c_hi).
  const int split = blockIdx.x / bps;
  const int bx = blockIdx.x - split * bps;
  const int c_lo = split * cps;
  const int c_hi = min(C, c_lo + cps);
  const bool single = c_hi - c_lo <= seg_chunks;
  bool staged = false;
  // Uniform over the block: every thread runs the same trips (barriers below).
  for (int base = bx * groups; base < tasks; base += bps * groups) {
    const int task = base + group;
    const bool active = task < tasks;
    const int n0 = task * R;
    float acc[MT][R];
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r) acc[m][r] = 0.f;
    for (int seg = c_lo; seg < c_hi; seg += seg_chunks) {
      const int end = min(c_hi, seg + seg_chunks);
      // A ring of P + 1 chunks per lane: while one is computed, the next P are in flight
      // (4 row-chunks of 16 bytes whatever R is). Unrolled, so every index is static.
      uint4 w[P + 1][R];
      TS s[P + 1][R][BPC];
      unsigned z[P + 1][R][BPC];
      float zf[P + 1][R][BPC];
      if (active) {
#pragma unroll
        for (int p = 0; p <= P; ++p) {
          const int cp = seg + lane_g + p * G;
          if (cp < end)
            load_chunk<TS, BITS, BLOCK, ZP, R, BPC, VPC>(cp, n0, N, KB, RS, ZS, b, scales, zp8,
                                                         zpf, w[p], s[p], z[p], zf[p]);
        }
      }
      // A is staged while the first weights are in flight: the two latencies overlap. A
      // segment of A is staged once per block when it is all of the split's chunks.
      if (!single || !staged) {
        if (!single) __syncthreads();  // every lane is done with the previous segment
        stage_a<TA>(a, oq_smem_a, M, K, seg * VPC, slots, MT);
        __syncthreads();
        staged = true;
      }
      if (!active) continue;
      for (int c = seg + lane_g; c < end;) {
#pragma unroll
        for (int p = 0; p <= P; ++p, c += G) {
          if (c < end) {
            compute_chunk<TS, BITS, BLOCK, ZP, R, MT, BPC, VPC>(c, c - seg, oq_smem_a, slots,
                                                                w[p], s[p], z[p], zf[p], acc);
            const int cn = c + (P + 1) * G;
            if (cn < end)
              load_chunk<TS, BITS, BLOCK, ZP, R, BPC, VPC>(cn, n0, N, KB, RS, ZS, b, scales,
                                                           zp8, zpf, w[p], s[p], z[p], zf[p]);
          }
        }
      }
    }
    // Every lane takes part in the shuffles (inactive ones add zeros).
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int r = 0; r < R; ++r)
        for (int off = G >> 1; off > 0; off >>= 1)
          acc[m][r] += __shfl_xor_sync(0xffffffffu, acc[m][r], off);
    if (active && lane_g == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int n = n0 + r;
        if (n >= N) break;
        if (bps != (int)gridDim.x) {  // split K: float32 partials, merged below
#pragma unroll
          for (int m = 0; m < MT; ++m)
            if (m < M) part[((long long)split * M + m) * N + n] = acc[m][r];
        } else {
          const float bv = has_bias ? to_float<TO>(bias[n]) : 0.f;
#pragma unroll
          for (int m = 0; m < MT; ++m)
            if (m < M) y[(long long)m * N + n] = from_float<TO>(acc[m][r] + bv);
        }
      }
    }
  }
  const int splits = (int)gridDim.x / bps;
  if (splits == 1) return;
  // The last of the splits of this block's tasks (blocks bx, bx + bps, ...) to finish merges
  // them: its partials are made visible device-wide before the ticket is taken, and the
  // merger puts the ticket back to 0 for the next launch (CUDA graph replays).
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int ticket = atomicAdd(done + bx, 1);
    oq_last = ticket == splits - 1;
    if (oq_last) done[bx] = 0;
  }
  __syncthreads();
  if (!oq_last) return;
  __threadfence();  // the other splits' partials are read after their tickets
  // Columns of the tasks block bx walked, every row of A; the splits added in order, through
  // L2 (__ldcg: another block wrote them, a stale L1 line must not be read).
  const int cols = groups * R;
  for (int base = bx * groups; base < tasks; base += bps * groups) {
    for (int i = threadIdx.x; i < M * cols; i += blockDim.x) {
      const int m = i / cols;
      const int n = base * R + (i - m * cols);
      if (n >= N) continue;
      float sum = 0.f;
      for (int j = 0; j < splits; ++j) sum += __ldcg(part + ((long long)j * M + m) * N + n);
      if (has_bias) sum += to_float<TO>(bias[n]);
      y[(long long)m * N + n] = from_float<TO>(sum);
    }
  }
}


// BYTES (a multiple of 8) from src to dst, both aligned to min(BYTES, 16), in 16- or 8-byte
// stores.
template <int BYTES>
__device__ __forceinline__ void store_words(void* dst, const void* src) {
  if constexpr (BYTES % 16 == 0) {
#pragma unroll
    for (int i = 0; i < BYTES / 16; ++i)
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
  } else {
    static_assert(BYTES % 8 == 0, "whole 8-byte units");
#pragma unroll
    for (int i = 0; i < BYTES / 8; ++i)
      reinterpret_cast<uint2*>(dst)[i] = reinterpret_cast<const uint2*>(src)[i];
  }
}

// Rows [n0, n0 + rows) of the dequantised weight, w[t, k] = (q - zp) * scale, as TW,
// one thread per packed 32-bit word (the CPU kernel's float32 arithmetic, bit for bit).
// vec (K a whole number of words, w 16-byte aligned): a word's values start at a multiple
// of their own size, so they leave in 8/16-byte stores; one 2-byte store each held the
// kernel to ~15% of the write bandwidth (7.4 of a 2000-token 1.5B int4 prefill's 32.5 ms
// of kernels on the H100).
template <typename TS, typename TW, int BITS, int BLOCK, int ZP>
__global__ void __launch_bounds__(256) nbits_dequant(
    const unsigned char* __restrict__ b, const TS* __restrict__ scales,
    const unsigned char* __restrict__ zp8, const float* __restrict__ zpf, TW* __restrict__ w,
    int n0, int rows, int K, int KB, int RS, int ZS, int vec) {
  using namespace oq;
  constexpr int VPW = 32 / BITS;
  constexpr unsigned ZMASK = (1u << BITS) - 1u;
  const int wpr = (K + VPW - 1) / VPW;  // words per row that hold values below K
  const long long total = (long long)rows * wpr;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const int t = (int)(i / wpr);
    const int wi = (int)(i - (long long)t * wpr);
    const long long n = n0 + t;
    const int k0 = wi * VPW;
    const int kb = k0 / BLOCK;
    const unsigned word = *reinterpret_cast<const unsigned*>(b + n * RS + 4LL * wi);
    const float sc = to_float<TS>(scales[n * KB + kb]);
    float off = 8388608.0f;
    if constexpr (ZP == 0) off += (float)(1 << (BITS - 1));
    if constexpr (ZP == 1) {
      const unsigned zbyte = zp8[n * ZS + ((kb * BITS) >> 3)];
      off = __uint_as_float(0x4B000000u | ((zbyte >> ((kb * BITS) & 7)) & ZMASK));
    }
    float d[VPW];
    unpack_word<BITS>(word, off, d);
    TW* out = w + (long long)t * K;
    if (vec) {
      alignas(16) TW v[VPW];
#pragma unroll
      for (int j = 0; j < VPW; ++j) {
        float x = d[j];
        if constexpr (ZP == 2) x -= zpf[n * KB + kb];
        v[j] = from_float<TW>(x * sc);
      }
      store_words<VPW * sizeof(TW)>(out + k0, v);
      continue;
    }
#pragma unroll
    for (int j = 0; j < VPW; ++j) {
      float v = d[j];
      if constexpr (ZP == 2) v -= zpf[n * KB + kb];
      if (k0 + j < K) out[k0 + j] = from_float<TW>(v * sc);
    }
  }
}

// accuracy_level 4: A rounded to int8 per block of K, as float32: one warp per (row, block).
// amax / 127 and 127 / amax (1 for an all-zero block), rint (half to even): the CPU's steps.
template <typename TA>
__global__ void __launch_bounds__(256) quantize_a_int8(
    const TA* __restrict__ a, float* __restrict__ out, int M, int K, int block, int KB) {
  using namespace oq;
  const long long warp = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (warp >= (long long)M * KB) return;  // whole warps leave together
  const long long m = warp / KB;
  const int kb = (int)(warp - m * KB);
  const TA* row = a + m * K;
  const int k_base = kb * block;
  float amax = 0.f;
  for (int i = lane; i < block; i += 32) {
    const int k = k_base + i;
    if (k < K) amax = fmaxf(amax, fabsf(to_float<TA>(row[k])));
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const float scale = amax / 127.0f;
  const float inv = 127.0f / (amax == 0.f ? 1.f : amax);
  for (int i = lane; i < block; i += 32) {
    const int k = k_base + i;
    if (k < K) out[m * K + k] = rintf(to_float<TA>(row[k]) * inv) * scale;
  }
}
"""
)


def gemv_name(ta: str, ts: str, to: str, bits: int, block: int, zp: int, r: int, mt: int) -> str:
    return f"nbits_gemv<{ta}, {ts}, {to}, {bits}, {block}, {zp}, {r}, {mt}>"


def dequant_name(ts: str, tw: str, bits: int, block: int, zp: int) -> str:
    return f"nbits_dequant<{ts}, {tw}, {bits}, {block}, {zp}>"


def quantize_name(ta: str) -> str:
    return f"quantize_a_int8<{ta}>"


@dataclass(frozen=True)
class GemvGeometry:
    """How one GEMV instantiation covers an (M <= mt) x N product."""

    mt: int  # rows of A per launch (template)
    r: int  # output columns per task (template)
    log2g: int  # lanes per task, as a power of two
    seg_chunks: int  # chunks of A staged in shared memory at a time (a multiple of 8)
    blocks: int  # grid size (all splits)
    smem: int  # dynamic shared memory, bytes
    splits: int = 1  # blocks along K; > 1: float32 partials, merged by each task set's last
    bps: int = 1  # blocks per split (and split tickets)
    cps: int = 1  # chunks per split


def _in_flight(r: int, g: int, lanes: int, cps: int, resident: int) -> int:
    """Weight bytes the resident lanes have requested at once: each keeps its ring of
    ``P + 1`` chunks (``P = 4 / r``, one ahead at ``r = 4``) of ``r`` rows in flight."""
    ring = (4 // r if r < 4 else 1) + 1
    return min(lanes, resident) * min(ring, math.ceil(cps / g)) * r * 16


def _score(n: int, chunks: int, mt: int, r: int, g: int, s: int, resident: int) -> float:
    """Share of the device a candidate keeps busy (see :func:`gemv_geometry`)."""
    tasks = -(-n // r)
    cps = -(-chunks // s)
    lanes = tasks * g * s
    waves = lanes / resident
    tail = waves / math.ceil(waves) if waves >= 1 else waves
    if _in_flight(r, g, lanes, cps, resident) >= 16 * n * chunks:
        # Every weight byte is requested at once: one memory latency, whatever the waves, as
        # long as every SM takes part (one SM alone cannot draw its share of the bandwidth).
        tail = min(1.0, lanes / (resident // 2))
    rounds = math.ceil(cps / g)
    busy = cps / (rounds * g)
    closing = rounds / (rounds + (2 * (g.bit_length() - 1) + 8) / 126)
    # Partials are written and read once more (float32, 8 bytes a value) beside the weights,
    # and the merge runs after the last split ends (a tail; the factor dates from the second
    # launch it replaced and is kept until the one-launch merge is timed).
    partials = 1.0 / (1.0 + (8.0 * s * mt * n / (16.0 * n * chunks) if s > 1 else 0.0))
    merge = 0.9 if s > 1 else 1.0
    return tail * busy * closing * partials * merge / _R_COST[r]


def gemv_geometry(
    n: int,
    chunks: int,
    bits: int,
    mt: int,
    sms: int,
    force: tuple[int, int] | None = None,
    splits: int | None = None,
) -> GemvGeometry:
    """Launch geometry from the product's shape and the device's SM count.

    Candidates: ``r`` (columns per task) in 4, 2, 1, ``G`` (lanes per task)
    from 4 (so a task's lanes read at least 64 contiguous bytes) up to the
    chunks a row has, and ``S`` (splits of K across blocks, :func:`splits_for`):
    1 unless the lanes (tasks times ``G``) fall short of those resident at
    once and cannot give every SM a block with every weight byte requested at
    once. Each candidate is scored by the share of the device its lanes keep
    busy: ``waves`` is its lanes over those resident at once; the last wave
    runs part-full (``waves / ceil(waves)``), unless every weight byte is
    requested at once from every SM (one memory latency whatever the
    waves); lanes idle in a task's last round of chunks waste issue
    slots; fewer columns per task re-read A from shared memory per column
    (about 7% more instructions at r = 2, 20% at r = 1); a task's closing
    shuffles cost about (2 log2 G + 8) / 126 of a chunk's work; a split's
    float32 partials are traffic beside the weights'. The estimates are
    counts, not measurements: ``bench/gpu_gemv_bench.py`` times the result.
    ``force`` (r, G) and ``splits`` override the choice (benchmarks and tests).
    """
    vpw = 32 // bits
    resident = max(1, sms * RESIDENT_THREADS_PER_SM)
    r_cap = max(1, min(4, GEMV_MAX_M // mt, 32 // vpw))
    g_cap = min(32, pow2_ceil(chunks))
    best: tuple[float, int, int, int] | None = None
    for r in (4, 2, 1):
        if r > r_cap:
            continue
        if force is not None and r != force[0]:
            continue
        tasks = -(-n // r)
        g = min(4, g_cap)
        while g <= g_cap:
            if force is None or g == force[1]:
                s = splits_for(r, g, n, chunks, resident)
                score = _score(n, chunks, mt, r, g, s, resident)
                if best is None or score > best[0] + 1e-9:
                    best = (score, r, g, s)
            g *= 2
    if best is None:  # a forced geometry outside the candidates
        assert force is not None
        r, g = force
        best = (0.0, r, g, splits_for(r, g, n, chunks, resident))
    _, r, g, s = best
    if splits is not None:
        s = max(1, min(splits, chunks))
    cps = -(-chunks // s)
    s = -(-chunks // cps)  # no empty split
    tasks = -(-n // r)
    per_chunk = mt * vpw * 16  # shared bytes per chunk of A (float4 slots)
    seg = min(-(-cps // 8) * 8, max(8, SMEM_BUDGET // per_chunk // 8 * 8))
    groups = BLOCK_THREADS // g
    bps = max(1, min(-(-tasks // groups), sms * 64))
    return GemvGeometry(mt, r, g.bit_length() - 1, seg, bps * s, per_chunk * seg, s, bps, cps)


def splits_for(r: int, g: int, n: int, chunks: int, resident: int) -> int:
    """The fewest splits of K that fill the resident lanes, or give every SM a block and
    have every weight byte requested at once, each lane keeping at least
    :data:`MIN_SPLIT_CHUNKS` chunks of its split; 1 when one launch already does."""
    lanes = -(-n // r) * g
    cap = max(1, chunks // (g * MIN_SPLIT_CHUNKS))
    for s in range(1, cap + 1):
        cps = -(-chunks // s)
        if lanes * s >= resident:
            return s
        if (
            lanes * s >= resident // 2
            and _in_flight(r, g, lanes * s, cps, resident) >= 16 * n * chunks
        ):
            return s
    return cap


def mt_for(m: int) -> int:
    """The GEMV instantiation (rows of A per launch) that covers ``m`` rows."""
    return 1 if m <= 1 else 2 if m == 2 else 4 if m <= 4 else 8


def module(exprs: tuple[str, ...]) -> Any:
    from onnxep.providers_cuda import nvrtc

    return nvrtc.raw_module(SOURCE, exprs)
