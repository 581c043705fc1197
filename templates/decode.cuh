// One decoding step in one launch (rnncc_abi.h: rnncc_decode): a block owns kUnits units of one
// head for a chunk of kChunk batch rows. It copies the chunk's x and h (the recurrent state)
// into shared memory as float, computes its rows of W x (when x is given) and R h with FFMA,
// each warp kPassRows rows at a time (a lane holds 8 columns of each row, then the warp's
// partial sums are reduce-scattered so every lane ends with whole sums), and runs the cell
// (C::forward) on its units × rows. No grid barrier: the step reads only the old states.
// Templated on the generated cell struct C (the stepwise library's). Every storage dtype.
#pragma once
#include <cstdint>
#include <cstring>

#include "rnncc_abi.h"
#include "rnncc_ops.cuh"

namespace rnncc {
namespace decode {

constexpr int kUnits = 8;  // units of a block
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;

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
      T e[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) e[j] = j < n ? p[j] : from_float<T>(0.0f);
      memcpy(w, e, sizeof(w));
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

  // What the cell reads, for unit u0 + u of head n and batch row b0 + b.
  template <typename T>
  struct In {
    const rnncc_decode_args& a;
    const float* sums;
    int u, b, gb;
    long long hd, NHD;
    __device__ __forceinline__ float state(int k) const {
      return to_float(static_cast<const T*>(a.states)[k * a.states_stride + gb * NHD + hd]);
    }
    __device__ __forceinline__ float wx(int k) const {
      if (a.x == nullptr) return to_float(static_cast<const T*>(a.Wx)[(gb * kGx + k) * NHD + hd]);
      const float wb = a.Wb ? to_float(static_cast<const T*>(a.Wb)[k * NHD + hd]) : 0.0f;
      return sums[(k * kUnits + u) * kChunk + b] + wb;
    }
    __device__ __forceinline__ float rh(int k) const { return sums[((kGx + k) * kUnits + u) * kChunk + b]; }
    __device__ __forceinline__ float bias(int k) const { return to_float(static_cast<const T*>(a.bias)[k * NHD + hd]); }
    __device__ __forceinline__ float param(int k) const { return to_float(static_cast<const T*>(a.params)[k * NHD + hd]); }
  };

  template <typename T>
  static __device__ void step(const rnncc_decode_args& a) {
    extern __shared__ __align__(16) float smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int u0 = blockIdx.x * kUnits, n = blockIdx.y, b0 = blockIdx.z * kChunk;
    const int D = a.D, I = a.x ? a.I : 0, Ip = padded(I), Dp = padded(D);
    const long long NHD = (long long)a.NH * D;
    float* const xs = smem;
    float* const hs = xs + kChunk * Ip;
    float* const sums = hs + kChunk * Dp;

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

    // The cell on (unit, batch row) pairs.
    for (int e = threadIdx.x; e < kUnits * kChunk; e += kThreads) {
      const int u = e / kChunk, b = e % kChunk, gb = b0 + b, d = u0 + u;
      if (d >= D || gb >= a.B) continue;
      const long long hd = (long long)n * D + d;
      float next[kS];
      C::forward(In<T>{a, sums, u, b, gb, hd, NHD}, next);
#pragma unroll
      for (int k = 0; k < kS; ++k)
        static_cast<T*>(a.new_states)[k * a.new_states_stride + gb * NHD + hd] = from_float<T>(next[k]);
#pragma unroll
      for (int o = 0; o < kO; ++o)
        if (a.y) static_cast<T*>(a.y)[((long long)o * a.B + gb) * NHD + hd] = from_float<T>(next[C::output_state(o)]);
    }
  }
};

template <class C, int kChunk, typename T>
__global__ void __launch_bounds__(kThreads) step_kernel(const rnncc_decode_args a) {
  Kernels<C, kChunk>::template step<T>(a);
}

template <class C, int kChunk, typename T>
int launch_as(const rnncc_decode_args* a, cudaStream_t stream) {
  const size_t smem = Kernels<C, kChunk>::smem_bytes(a->x ? a->I : 0, a->D);
  auto* kernel = step_kernel<C, kChunk, T>;
  if (smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (err != cudaSuccess) return (int)err;
  }
  const dim3 grid((a->D + kUnits - 1) / kUnits, a->NH, (a->B + kChunk - 1) / kChunk);
  kernel<<<grid, kThreads, smem, stream>>>(*a);
  return (int)cudaGetLastError();
}

// A chunk of 16 batch rows from B > 4 on (kChunk rows are summed whether present or not).
template <class C, typename T>
int launch_for(const rnncc_decode_args* a, cudaStream_t stream) {
  return a->B > 4 ? launch_as<C, 16, T>(a, stream) : launch_as<C, 4, T>(a, stream);
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
