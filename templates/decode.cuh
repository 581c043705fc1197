// One decoding step in one launch (rnncc_abi.h: rnncc_decode): a block owns kUnits units of one
// head for a chunk of batch rows. It copies the chunk's x and h (the recurrent state) into
// shared memory, computes its rows of W x (when x is given) and R h, and runs the cell
// (C::forward) on its units × rows. No grid barrier: the step reads only the old states. The
// rows' sums run on the tensor cores for 16-bit storage (MmaKernels) and with FFMA for float
// (Kernels: each warp kPassRows rows at a time, a lane holding 8 columns of each, the warp's
// partial sums reduce-scattered so that every lane ends with whole sums). Templated on the
// generated cell struct C (the stepwise library's).
#pragma once
#include <cstdint>
#include <cstring>

#include <type_traits>

#include "rnncc_abi.h"
#include "rnncc_mma.cuh"
#include "rnncc_ops.cuh"

namespace rnncc {
namespace decode {

constexpr int kUnits = 8;  // units of a block: four gates' rows make two whole m tiles
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;

// The launch is programmatic (launch_as, on sm_90): the kernel may start while the kernel
// before it in the stream finishes. It waits for that kernel (its completion and its writes)
// before it reads what that kernel may write (dependency_wait), and lets the next one start
// (launch_dependents; the next waits in turn, so nothing of this step is read before it
// ends): a stack's next layer launches while the layer below finishes.
__device__ __forceinline__ void dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void dependent_launch() {
  dependency_wait();
  launch_dependents();
}

// v[i] of every lane summed over the warp, scattered: lane L ends with the sums of values
// N / 32 · L + i in v[i], i < N / 32 (N a multiple of 32). Round kOff halves the values a
// lane holds: it keeps the half its lane bit kOff selects and adds its partner's of it.
template <int kOff = 16, int N>
__device__ __forceinline__ void reduce_scatter(float (&v)[N], const int lane) {
  static_assert(N % (2 * kOff) == 0, "32 lanes share the sums");
  constexpr int h = N * kOff / 32;  // the values kept this round
  const bool upper = lane & kOff;
#pragma unroll
  for (int i = 0; i < h; ++i) {
    const float send = upper ? v[i] : v[i + h];
    const float keep = upper ? v[i + h] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kOff);
  }
  if constexpr (kOff > 1) reduce_scatter<kOff / 2>(v, lane);
}

// 8 consecutive elements of T as loaded: one 16-byte load (16-bit T) or two (float) where
// `vec` (p 16-byte aligned), else element by element, zeros from n on.
template <typename T>
struct Pack8 {
  static constexpr int kWords = sizeof(T) == 4 ? 2 : 1;
  uint4 w[kWords];

  __device__ __forceinline__ void load(const T* p, const bool vec, const int n) {
    if (vec) {
#pragma unroll
      for (int i = 0; i < kWords; ++i) w[i] = reinterpret_cast<const uint4*>(p)[i];
    } else {
      uint32_t word[4 * kWords];
#pragma unroll
      for (int i = 0; i < 4 * kWords; ++i) word[i] = 0u;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        if (j >= n) continue;
        if constexpr (sizeof(T) == 4) {
          word[j] = __float_as_uint(to_float(p[j]));
        } else {
          word[j / 2] |= (uint32_t)(*reinterpret_cast<const unsigned short*>(p + j)) << (16 * (j % 2));
        }
      }
#pragma unroll
      for (int i = 0; i < kWords; ++i) w[i] = make_uint4(word[4 * i], word[4 * i + 1], word[4 * i + 2], word[4 * i + 3]);
    }
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = make_uint4(0, 0, 0, 0);
  }
  __device__ __forceinline__ float operator[](const int j) const {
    T e[8];
    memcpy(e, w, sizeof(w));
    return to_float(e[j]);
  }
};

template <class C, int kChunk>
struct Kernels {
  static constexpr int kS = C::kS, kO = C::kO, kGx = C::kGx, kGr = C::kGr, kRec = C::kRec;
  // Rows a warp sums at once: kPassRows · kChunk values, a multiple of the 32 lanes.
  static constexpr int kPassRows = kChunk >= 16 ? 4 : 32 / kChunk;
  static_assert(kUnits % kPassRows == 0, "a pass stays inside one gate");
  static constexpr int kRows = (kGx + kGr) * kUnits;  // W's gates, then R's; unit-minor

  // Shared memory: x [kChunk][Ip], h [kChunk][Dp] (rows padded to 8 with zeros), the rows'
  // sums [kRows][kChunk].
  static __host__ __device__ int padded(const int k) { return (k + 7) / 8 * 8; }
  static __host__ __device__ size_t smem_bytes(const int I, const int D) {
    return sizeof(float) * ((size_t)kChunk * (padded(I) + padded(D)) + (size_t)kRows * kChunk);
  }

  static_assert(kUnits * kChunk <= kThreads, "a thread per (unit, batch row) of the block");
  static constexpr int kGb = C::kGb, kP = C::kP;

  // Thread t's element of the cell, unit u0 + t % kUnits and batch row b0 + t / kUnits (a
  // batch row's units side by side: their states are read and written together), and
  // what the cell reads of it besides the sums, loaded at the start (their latency hides
  // behind the weights'): the old states, W x (given) or the projection's bias, b, params.
  struct Element {
    int u, b, gb;
    long long hd;  // (head, unit) in [NH, D]
    bool live;
    float state[kS], wx[kGx > 0 ? kGx : 1], bias[kGb > 0 ? kGb : 1], param[kP > 0 ? kP : 1];

    template <typename T>
    __device__ __forceinline__ void load(const rnncc_decode_args& a, const int u0, const int n, const int b0) {
      u = threadIdx.x % kUnits;
      b = threadIdx.x / kUnits;
      gb = b0 + b;
      hd = (long long)n * a.D + u0 + u;
      live = threadIdx.x < kUnits * kChunk && u0 + u < a.D && gb < a.B;
      if (!live) return;
      const long long NHD = (long long)a.NH * a.D;
      const T* const st = static_cast<const T*>(a.states);
#pragma unroll
      for (int k = 0; k < kS; ++k) state[k] = to_float(st[k * a.states_stride + gb * NHD + hd]);
#pragma unroll
      for (int k = 0; k < kGx; ++k) {
        if (a.x == nullptr) {
          wx[k] = to_float(static_cast<const T*>(a.Wx)[((long long)gb * kGx + k) * NHD + hd]);
        } else {
          wx[k] = a.Wb ? to_float(static_cast<const T*>(a.Wb)[k * NHD + hd]) : 0.0f;  // + the sums
        }
      }
#pragma unroll
      for (int k = 0; k < kGb; ++k) bias[k] = to_float(static_cast<const T*>(a.bias)[k * NHD + hd]);
#pragma unroll
      for (int k = 0; k < kP; ++k) param[k] = to_float(static_cast<const T*>(a.params)[k * NHD + hd]);
    }
  };

  // What the cell reads: the element's inputs and the rows' sums [kRows][kChunk].
  struct In {
    const Element& e;
    const float* sums;
    bool projected;  // W x is in the sums (x given)
    __device__ __forceinline__ float state(int k) const { return e.state[k]; }
    __device__ __forceinline__ float wx(int k) const {
      return projected ? sums[(k * kUnits + e.u) * kChunk + e.b] + e.wx[k] : e.wx[k];
    }
    __device__ __forceinline__ float rh(int k) const { return sums[((kGx + k) * kUnits + e.u) * kChunk + e.b]; }
    __device__ __forceinline__ float bias(int k) const { return e.bias[k]; }
    __device__ __forceinline__ float param(int k) const { return e.param[k]; }
  };

  template <typename T>
  static __device__ void step(const rnncc_decode_args& a) {
    extern __shared__ __align__(16) float smem[];
    dependent_launch();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int u0 = blockIdx.x * kUnits, n = blockIdx.y, b0 = blockIdx.z * kChunk;
    const int D = a.D, I = a.x ? a.I : 0, Ip = padded(I), Dp = padded(D);
    const long long NHD = (long long)a.NH * D;
    float* const xs = smem;
    float* const hs = xs + kChunk * Ip;
    float* const sums = hs + kChunk * Dp;

    Element e;
    e.template load<T>(a, u0, n, b0);
    // The chunk's x and h as float, zeros past the batch and in the padding: 8-element
    // groups, kLoads of them per thread in flight at once.
    const T* const h = static_cast<const T*>(a.states) + kRec * a.states_stride + (long long)n * D;
    const int xg = kChunk * Ip / 8, groups = xg + kChunk * Dp / 8;
    const bool xvec = I % 8 == 0 && (reinterpret_cast<uintptr_t>(a.x) & 15) == 0;
    const bool hvec = D % 8 == 0 && NHD % 8 == 0 && (reinterpret_cast<uintptr_t>(h) & 15) == 0;
    constexpr int kLoads = 4;
    for (int g0 = threadIdx.x; g0 < groups; g0 += kLoads * kThreads) {
      Pack8<T> v[kLoads];
#pragma unroll
      for (int i = 0; i < kLoads; ++i) {
        const int g = g0 + i * kThreads, in_x = g < xg, gg = in_x ? g : g - xg;
        const int per = (in_x ? Ip : Dp) / 8, b = gg / per, k = gg % per * 8, K = in_x ? I : D;
        if (g < groups && b0 + b < a.B && k < K) {
          v[i].load(in_x ? static_cast<const T*>(a.x) + (long long)(b0 + b) * I + k : h + (long long)(b0 + b) * NHD + k,
                    in_x ? xvec : hvec, K - k);
        } else {
          v[i].zero();
        }
      }
#pragma unroll
      for (int i = 0; i < kLoads; ++i) {
        const int g = g0 + i * kThreads;
        if (g < groups) {
          float* const dst = g < xg ? xs + g * 8 : hs + (g - xg) * 8;  // rows of Ip (Dp) values: groups in order
          reinterpret_cast<float4*>(dst)[0] = make_float4(v[i][0], v[i][1], v[i][2], v[i][3]);
          reinterpret_cast<float4*>(dst)[1] = make_float4(v[i][4], v[i][5], v[i][6], v[i][7]);
        }
      }
    }
    __syncthreads();

    // The rows' sums: row r is gate r / kUnits (W's first), unit u0 + r % kUnits.
    for (int r0 = kPassRows * warp; r0 < kRows; r0 += kPassRows * kWarps) {
      const int q = r0 / kUnits;
      const bool from_w = q < kGx;
      if (from_w && a.x == nullptr) continue;  // Wx given: the cell reads it
      const int K = from_w ? I : D, Kp = from_w ? Ip : Dp;
      const T* const base = from_w ? static_cast<const T*>(a.W) + ((long long)q * NHD + (long long)n * D + u0) * I
                                   : static_cast<const T*>(a.R) + ((long long)(q - kGx) * NHD + (long long)n * D + u0) * D;
      const float* const v = from_w ? xs : hs;
      const bool vec = K % 8 == 0 && (reinterpret_cast<uintptr_t>(base) & 15) == 0;
      float acc[kPassRows * kChunk];
#pragma unroll
      for (int i = 0; i < kPassRows * kChunk; ++i) acc[i] = 0.0f;
      // Each lane's 8 columns of the pass's rows, the next ones loaded while these are used.
      Pack8<T> w[kPassRows], next[kPassRows];
      auto load = [&](Pack8<T> (&dst)[kPassRows], const int k) {
#pragma unroll
        for (int j = 0; j < kPassRows; ++j) {
          const int u = r0 % kUnits + j;
          if (u0 + u < D && k < K) {
            dst[j].load(base + (long long)u * K + k, vec, K - k);
          } else {
            dst[j].zero();
          }
        }
      };
      load(w, 8 * lane);
      for (int k = 8 * lane; k < K; k += 256) {
        load(next, k + 256);
#pragma unroll
        for (int b = 0; b < kChunk; ++b) {
          const float4 v0 = *reinterpret_cast<const float4*>(v + b * Kp + k);
          const float4 v1 = *reinterpret_cast<const float4*>(v + b * Kp + k + 4);
#pragma unroll
          for (int j = 0; j < kPassRows; ++j) {
            float s = acc[j * kChunk + b];
            s = fmaf(w[j][0], v0.x, s); s = fmaf(w[j][1], v0.y, s); s = fmaf(w[j][2], v0.z, s); s = fmaf(w[j][3], v0.w, s);
            s = fmaf(w[j][4], v1.x, s); s = fmaf(w[j][5], v1.y, s); s = fmaf(w[j][6], v1.z, s); s = fmaf(w[j][7], v1.w, s);
            acc[j * kChunk + b] = s;
          }
        }
#pragma unroll
        for (int j = 0; j < kPassRows; ++j) w[j] = next[j];
      }
      reduce_scatter(acc, lane);
      constexpr int kMine = kPassRows * kChunk / 32;  // whole sums per lane: (row j, batch b)
#pragma unroll
      for (int i = 0; i < kMine; ++i) {
        const int flat = kMine * lane + i;
        sums[(r0 + flat / kChunk) * kChunk + flat % kChunk] = acc[i];
      }
    }
    __syncthreads();

    cell<T>(a, sums, e);
  }

  // The cell on thread t's element (Element), from the rows' sums [kRows][kChunk].
  template <typename T>
  static __device__ __forceinline__ void cell(const rnncc_decode_args& a, const float* sums, const Element& e) {
    if (!e.live) return;
    const long long NHD = (long long)a.NH * a.D;
    float next[kS];
    C::forward(In{e, sums, a.x != nullptr}, next);
#pragma unroll
    for (int k = 0; k < kS; ++k)
      static_cast<T*>(a.new_states)[k * a.new_states_stride + e.gb * NHD + e.hd] = from_float<T>(next[k]);
#pragma unroll
    for (int o = 0; o < kO; ++o)
      if (a.y) static_cast<T*>(a.y)[((long long)o * a.B + e.gb) * NHD + e.hd] = from_float<T>(next[C::output_state(o)]);
  }
};

// The 16-bit storage: the rows' sums on the tensor cores (mma.sync m16n8k16, fp32
// accumulation). The block's weight rows (W's, then R's; row r of a part is gate r / kUnits,
// unit r % kUnits, m tile m its rows 16 m .. 16 m + 15) are copied into shared memory all at
// once (bulk copies on sm_90, else cp.async: one memory round trip per step), beside the
// chunk's x and h as stored; A fragments come through ldmatrix, B from 32-bit loads. A warp
// takes every m tile of a part for the part's k tiles warp, warp + kWarps, ...; the warps'
// partial tiles are summed through shared memory (over the weights, once they are read) into
// the rows' sums.
template <class C, int kChunk>
struct MmaKernels {
  using Base = Kernels<C, kChunk>;
  static constexpr int kGx = C::kGx, kGr = C::kGr, kRec = C::kRec;
  static constexpr int kNT = kChunk / 8;  // n tiles: 8 batch rows each
  static constexpr int kMx = (kGx * kUnits + 15) / 16, kMr = (kGr * kUnits + 15) / 16;  // m tiles
  static constexpr int kM = kMx + kMr;
  static_assert(kChunk % 8 == 0 && kM > 0, "whole n tiles; some rows");
  static_assert(kUnits == kWarps, "a warp stages one unit's rows (stage)");

  // A row of K values in shared memory: K rounded up to 16 (zeros), and 8 more, so that the 8
  // rows of an ldmatrix (or of a B load) fall in distinct banks.
  static __host__ __device__ int stride(const int K) { return K > 0 ? (K + 15) / 16 * 16 + 8 : 0; }
  // Shared memory: the weights [16 kMx][Is] then [16 kMr][Ds] (the warps' tiles
  // [kWarps][kM][kNT][32][4] float over them afterwards), x [kChunk][Is], h [kChunk][Ds] as
  // stored, the rows' sums [Base::kRows][kChunk] float.
  static __host__ __device__ size_t weight_bytes(const int I, const int D) {
    const size_t w = 2 * (size_t)16 * (kMx * stride(I) + kMr * stride(D));
    const size_t red = sizeof(float) * (size_t)kWarps * kM * kNT * 128;
    return w > red ? w : red;
  }
  static __host__ __device__ size_t smem_bytes(const int I, const int D) {
    return weight_bytes(I, D) + 2 * (size_t)kChunk * (stride(I) + stride(D)) + sizeof(float) * (size_t)Base::kRows * kChunk;
  }

  // Copy `rows` rows of K values into `dst` (rows of Ks; row r from row_at(r), null: none),
  // zeros past K. Where `vec` (every row 16-byte aligned), on sm_90 and newer: one bulk copy a
  // row, issued by thread (warp r % kWarps, lane r / kWarps) so that every warp issues a few
  // and computes their addresses in parallel; `bytes` grows by the thread's (the warp's sum is
  // announced on `bar` at its arrival). A null row is left as it is: its sums (a weight row's
  // gate or unit past the block's, an x or h row's batch row past the batch) are never read,
  // and the MMA keeps every row of A and column of B to its own sums. Else, a warp per row,
  // its lanes along it: 16-byte cp.async where `vec` (`any`: a readable address, the source of
  // the zero-filling copies), element by element otherwise, zeros in null rows.
  template <typename T, int kRowsOf, class RowAt>
  static __device__ __forceinline__ void stage(unsigned short* dst, const int K, const bool vec, const T* any,
                                               [[maybe_unused]] const unsigned bar, [[maybe_unused]] unsigned& bytes,
                                               RowAt row_at) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, Ks = stride(K), chunks = (K + 15) / 16 * 2;
    __builtin_assume(warp < kWarps);  // row warp + kWarps i: its gate and unit fold (kUnits == kWarps)
    const unsigned base = (unsigned)__cvta_generic_to_shared(dst);
#if RNNCC_BULK_COPY
    if (vec) {
      static_assert(kRowsOf <= kThreads, "a row a thread");
      const int r = warp + kWarps * lane;
      const unsigned short* const src = r < kRowsOf ? reinterpret_cast<const unsigned short*>(row_at(r)) : nullptr;
      if (src != nullptr) {
        bulk_copy(base + 2 * r * Ks, src, 2 * K, bar);
        bytes += 2 * K;
        if (K % 16 != 0) *reinterpret_cast<uint4*>(dst + r * Ks + K) = make_uint4(0u, 0u, 0u, 0u);  // K + 8 .. 16
      }
      return;
    }
#endif
#pragma unroll
    for (int i = 0; i < (kRowsOf + kWarps - 1) / kWarps; ++i) {
      const int r = warp + kWarps * i;
      if (kRowsOf % kWarps != 0 && r >= kRowsOf) break;
      const unsigned short* const src = reinterpret_cast<const unsigned short*>(row_at(r));
      if (vec) {
        for (int j = lane; j < chunks; j += 32) {
          const bool ok = src != nullptr && 8 * j < K;
          cp_async<16>(base + 2 * (r * Ks + 8 * j), ok ? static_cast<const void*>(src + 8 * j) : any, ok);
        }
      } else {
        for (int k = lane; k < 8 * chunks; k += 32) dst[r * Ks + k] = src != nullptr && k < K ? src[k] : 0;
      }
    }
  }

  // c[m0 + m] += the part's staged rows (shared memory, rows of Ks) times v (the chunk's x or
  // h, rows of Ks) over k tiles first, first + every, ...
  template <typename T, int kParts>
  static __device__ __forceinline__ void product(float (&c)[kM][kNT][4], const int m0, const unsigned short* w,
                                                 const unsigned short* v, const int K, const int first,
                                                 const int every) {
    const int lane = threadIdx.x & 31, g8 = lane >> 2, c4 = lane & 3;
    const int Ks = stride(K), KT = (K + 15) / 16;
    // ldmatrix.x4: lane i gives row i % 8 of matrix i / 8 (rows 0-7 / 8-15, k 0-7 / 8-15).
    const unsigned a0 = (unsigned)__cvta_generic_to_shared(w + (lane % 16) * Ks + 8 * (lane / 16));
    for (int kt = first; kt < KT; kt += every) {
      const int k = 16 * kt;
      uint32_t b[kNT][2];
#pragma unroll
      for (int t = 0; t < kNT; ++t) {
        const unsigned short* p = v + (8 * t + g8) * Ks + k + 2 * c4;
        b[t][0] = *reinterpret_cast<const uint32_t*>(p);
        b[t][1] = *reinterpret_cast<const uint32_t*>(p + 8);
      }
#pragma unroll
      for (int m = 0; m < kParts; ++m) {
        uint32_t a[4];
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                     : "r"(a0 + 2 * (16 * m * Ks + k)));
#pragma unroll
        for (int t = 0; t < kNT; ++t) mma16816<T>(c[m0 + m][t], a, b[t][0], b[t][1]);
      }
    }
  }

  template <typename T>
  static __device__ void step(const rnncc_decode_args& a) {
    extern __shared__ __align__(16) float smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int u0 = blockIdx.x * kUnits, n = blockIdx.y, b0 = blockIdx.z * kChunk;
    const int D = a.D, I = a.x ? a.I : 0, Is = stride(I), Ds = stride(D);
    const long long NHD = (long long)a.NH * D;
    unsigned short* const wx_rows = reinterpret_cast<unsigned short*>(smem);
    unsigned short* const wr_rows = wx_rows + 16 * kMx * Is;
    float* const red = smem;
    unsigned short* const xs = reinterpret_cast<unsigned short*>(reinterpret_cast<char*>(smem) + weight_bytes(I, D));
    unsigned short* const hs = xs + kChunk * Is;
    float* const sums = reinterpret_cast<float*>(hs + kChunk * Ds);  // 16-byte aligned: strides are multiples of 8
    __shared__ alignas(8) unsigned long long mbar;  // the bulk copies' barrier: an arrival a warp
    const unsigned bar = (unsigned)__cvta_generic_to_shared(&mbar);
#if RNNCC_BULK_COPY
    if (threadIdx.x == 0) mbar_init(bar, kWarps);
    __syncthreads();
#endif

    // Every copy at once: the weights (before the wait for the kernel before this one where
    // that kernel writes neither), the chunk's x and h.
    unsigned bytes = 0;  // this thread's bulk copies'
    if (!a.weights_first) dependency_wait();
    if (kMx > 0 && a.x != nullptr) {
      const T* const w = static_cast<const T*>(a.W) + ((long long)n * D + u0) * I;
      const bool vec = I % 8 == 0 && (reinterpret_cast<uintptr_t>(w) & 15) == 0;
      stage<T, 16 * kMx>(wx_rows, I, vec, w, bar, bytes, [&](const int r) -> const T* {
        const int q = r / kUnits, u = r % kUnits;
        return q < kGx && u0 + u < D ? w + ((long long)q * NHD + u) * I : nullptr;
      });
    }
    if (kMr > 0) {
      const T* const w = static_cast<const T*>(a.R) + ((long long)n * D + u0) * D;
      const bool vec = D % 8 == 0 && (reinterpret_cast<uintptr_t>(w) & 15) == 0;
      stage<T, 16 * kMr>(wr_rows, D, vec, w, bar, bytes, [&](const int r) -> const T* {
        const int q = r / kUnits, u = r % kUnits;
        return q < kGr && u0 + u < D ? w + ((long long)q * NHD + u) * D : nullptr;
      });
    }
    if (a.weights_first) dependency_wait();
    launch_dependents();
    if (kMx > 0 && a.x != nullptr) {
      const T* const x = static_cast<const T*>(a.x);
      const bool xvec = I % 8 == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0;
      stage<T, kChunk>(xs, I, xvec, x, bar, bytes, [&](const int b) -> const T* {
        return b0 + b < a.B ? x + (long long)(b0 + b) * I : nullptr;
      });
    }
    const T* const h = static_cast<const T*>(a.states) + kRec * a.states_stride + (long long)n * D;
    const bool hvec = D % 8 == 0 && NHD % 8 == 0 && (reinterpret_cast<uintptr_t>(h) & 15) == 0;
    stage<T, kChunk>(hs, D, hvec, h, bar, bytes,
             [&](const int b) -> const T* { return b0 + b < a.B ? h + (long long)(b0 + b) * NHD : nullptr; });
#if RNNCC_BULK_COPY
    bytes = __reduce_add_sync(0xffffffffu, bytes);
    if (lane == 0) mbar_arrive_expect(bar, bytes);  // the warp's arrival
#else
    cp_async_commit();
#endif
    typename Base::Element e;  // loaded while the copies fly
    e.template load<T>(a, u0, n, b0);
#if RNNCC_BULK_COPY
    mbar_wait(bar, 0);
#else
    cp_async_wait<0>();
#endif
    __syncthreads();

    float c[kM][kNT][4];
#pragma unroll
    for (int m = 0; m < kM; ++m)
#pragma unroll
      for (int t = 0; t < kNT; ++t)
#pragma unroll
        for (int j = 0; j < 4; ++j) c[m][t][j] = 0.0f;
    // Where W x and R h are products of the same shape (x given), half of the warps take each
    // over the part's k tiles, and a row's sum is of half as many warps' tiles; else every warp
    // takes both parts over its share of their k tiles.
    const bool halves = kMx == kMr && kMx > 0 && a.x != nullptr;  // uniform
    constexpr int kHalf = kWarps / 2;
    if (halves) {
      if constexpr (kMx == kMr && kMx > 0) {
        if (warp < kHalf) {
          product<T, kMx>(c, 0, wx_rows, xs, I, warp, kHalf);
        } else {
          product<T, kMr>(c, kMx, wr_rows, hs, D, warp - kHalf, kHalf);
        }
      }
    } else {
      if constexpr (kMx > 0) {
        if (a.x != nullptr) product<T, kMx>(c, 0, wx_rows, xs, I, warp, kWarps);
      }
      if constexpr (kMr > 0) product<T, kMr>(c, kMx, wr_rows, hs, D, warp, kWarps);
    }
    __syncthreads();  // every warp is done with the weights: their space takes the tiles
    const int slot = halves ? warp % kHalf : warp, parts = halves ? kHalf : kWarps;  // a warp's tiles' place
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      if (halves && (m < kMx) != (warp < kHalf)) continue;  // the other half's part
#pragma unroll
      for (int t = 0; t < kNT; ++t)
        reinterpret_cast<float4*>(red)[((slot * kM + m) * kNT + t) * 32 + lane] = make_float4(c[m][t][0], c[m][t][1], c[m][t][2], c[m][t][3]);
    }
    __syncthreads();

    // The rows' sums: lane l's fragment of tile (m, t) (rows r, r + 8, columns b, b + 1),
    // summed over the `parts` warps' tiles a float4 at a time.
    for (int f = threadIdx.x; f < kM * kNT * 32; f += kThreads) {
      const float4* const part = reinterpret_cast<const float4*>(red) + f;
      float4 s = part[0];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) {
        if (w >= parts) break;
        const float4 v = part[w * kM * kNT * 32];
        s.x += v.x;
        s.y += v.y;
        s.z += v.z;
        s.w += v.w;
      }
      const int l = f % 32, t = f / 32 % kNT, m = f / (32 * kNT);
      const bool in_r = m >= kMx;
      const int r = 16 * (in_r ? m - kMx : m) + l / 4, rows = (in_r ? kGr : kGx) * kUnits;
      float* const at = sums + ((in_r ? kGx * kUnits : 0) + r) * kChunk + 8 * t + 2 * (l % 4);
      if (r < rows) {
        at[0] = s.x;
        at[1] = s.y;
      }
      if (r + 8 < rows) {
        at[8 * kChunk] = s.z;
        at[8 * kChunk + 1] = s.w;
      }
    }
    __syncthreads();
    Base::template cell<T>(a, sums, e);
  }
};

// K: Kernels (FFMA, float storage) or MmaKernels (16-bit storage).
template <class K, typename T>
__global__ void __launch_bounds__(kThreads, 1) step_kernel(const rnncc_decode_args a) {
  K::template step<T>(a);
}

template <class C, int kChunk, typename T>
int launch_as(const rnncc_decode_args* a, cudaStream_t stream) {
  using K = typename std::conditional<sizeof(T) == 2, MmaKernels<C, kChunk>, Kernels<C, kChunk>>::type;
  const size_t smem = K::smem_bytes(a->x ? a->I : 0, a->D);
  auto* kernel = step_kernel<K, T>;
  if (smem > 48 * 1024) {  // opt in, once per device and size (not on every step)
    static size_t allowed[64] = {};
    int device = 0;
    cudaGetDevice(&device);
    if (device >= 64 || allowed[device] < smem) {
      const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
      if (err != cudaSuccess) return (int)err;
      if (device < 64) allowed[device] = smem;
    }
  }
  static int major[64] = {};  // the device's compute capability, once
  int device = 0;
  cudaGetDevice(&device);
  if (device < 64 && major[device] == 0) cudaDeviceGetAttribute(&major[device], cudaDevAttrComputeCapabilityMajor, device);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((a->D + kUnits - 1) / kUnits, a->NH, (a->B + kChunk - 1) / kChunk);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;  // dependent_launch
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = device < 64 && major[device] >= 9 ? 1 : 0;
  return (int)cudaLaunchKernelEx(&cfg, kernel, *a);
}

// Chunks of 16 batch rows past a small batch (kChunk rows are summed whether present or not):
// from B > 4 with FFMA (float), B > 8 on the tensor cores (n tiles of 8 rows).
template <class C, typename T>
int launch_for(const rnncc_decode_args* a, cudaStream_t stream) {
  if constexpr (sizeof(T) == 2) {
    return a->B > 8 ? launch_as<C, 16, T>(a, stream) : launch_as<C, 8, T>(a, stream);
  } else {
    return a->B > 4 ? launch_as<C, 16, T>(a, stream) : launch_as<C, 4, T>(a, stream);
  }
}

// The library's entry point (rnncc_abi.h: rnncc_decode).
template <class C>
int step(const rnncc_decode_args* a, cudaStream_t stream) {
  if ((long long)a->B * a->NH * a->D == 0) return 0;
  switch (a->dtype) {
    case RNNCC_F32: return launch_for<C, float>(a, stream);
    case RNNCC_F16: return launch_for<C, __half>(a, stream);
    case RNNCC_BF16: return launch_for<C, __nv_bfloat16>(a, stream);
    default: return (int)cudaErrorInvalidValue;
  }
}

}  // namespace decode
}  // namespace rnncc
