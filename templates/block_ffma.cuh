// The block_ffma variant's kernels (float32 storage): each thread keeps one row of the head's
// R in registers as float, so the product is fp32-accurate. h lives in shared memory,
// transposed so that a warp's reads of it are broadcasts. Per step: R·h (one row × kBC columns
// per thread), a block barrier, the cell (C::forward) on kElemsPerThread elements per thread,
// a block barrier. The backward runs C::backward per step from the last, then dh += Rᵀ·dg.
// Templated on the generated cell struct C: the cell's shape, kD, kBC, and the plan's
// kThreads, kGroups and kTimeline (per-row lengths and the reverse direction, rnncc_abi.h: a
// row's W x, y and their cotangents at its positions, held steps past its length).
#pragma once
#include "rnncc_abi.h"
#include "rnncc_ops.cuh"
#include "timeline.cuh"

namespace rnncc {
namespace block_ffma {

template <class C>
struct Kernels {
  static constexpr int kS = C::kS, kO = C::kO, kGx = C::kGx, kGr = C::kGr, kGb = C::kGb, kP = C::kP, kRec = C::kRec;
  static constexpr int kD = C::kD, kBC = C::kBC, kThreads = C::kThreads, kGroups = C::kGroups;
  static constexpr bool kTimeline = C::kTimeline;
  static constexpr int kRows = kGr * kD;
  static_assert(kO >= 1 && kO <= kS && kRec >= 0 && kRec < kS, "the outputs and the recurrent state are some of the states");
  static_assert(kGx >= 0 && kGb >= 0 && kP >= 0, "gate and param counts are non-negative");

  static constexpr int kElems = kBC * kD;
  static constexpr int kElemsPerThread = (kElems + kThreads - 1) / kThreads;
  static_assert(kBC % 4 == 0, "h is read as float4 along the batch chunk");
  static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, at most 1024 threads");
  static_assert(kRows <= kThreads, "one row of R per thread: the head's R rows must not outnumber the threads");
  static_assert(kD <= 64, "R rows live in registers: head dims above 64 need another tier");
  static_assert((kD * kBC + kBC * (kRows > 0 ? kRows : 1)) * 4 <= 48 * 1024,
                "h and R·h must fit the 48 KiB of static shared memory");

  // What the forward cell reads for element q (batch row b, unit d) of a thread.
  struct ForwardIn {
    const float (&st)[kS][kElemsPerThread];
    const float (&wxv)[kGx > 0 ? kGx : 1][kElemsPerThread];
    const float (&rhs)[kBC][kRows > 0 ? kRows : 1];
    const float (&bv)[kGb > 0 ? kGb : 1][kElemsPerThread];
    const float (&pv)[kP > 0 ? kP : 1][kElemsPerThread];
    int q, b, d;
    __device__ __forceinline__ float state(int k) const { return st[k][q]; }
    __device__ __forceinline__ float wx(int k) const { return wxv[k][q]; }
    __device__ __forceinline__ float rh(int k) const { return rhs[b][k * kD + d]; }
    __device__ __forceinline__ float bias(int k) const { return bv[k][q]; }
    __device__ __forceinline__ float param(int k) const { return pv[k][q]; }
  };

  // Where the backward's element (step t at position p, head n, batch row gb, unit d; q of its
  // thread) sits in global memory: its row of the saved R·h (row), of dGr (grow), of W x and dWx
  // (x), of dy (y).
  struct BackwardAt {
    const rnncc_fused_bwd_args& a;
    int t, n, gb, d, q;
    long long NHD, row, grow, x, y;
    __device__ BackwardAt(const rnncc_fused_bwd_args& a, int t, int p, int n, int gb, int d, int q)
        : a(a), t(t), n(n), gb(gb), d(d), q(q), NHD((long long)a.NH * kD),
          row(((long long)t * a.NH + n) * a.B + gb), grow(((long long)n * a.T + t) * a.B + gb),
          x((((long long)gb * a.T + p) * kGx) * NHD + (long long)n * kD + d),
          y(((long long)gb * a.T + p) * NHD + (long long)n * kD + d) {}
  };

  // What the backward cell reads: old states from the saved history, gates from W x + the
  // saved R·h + b, the cotangents of the new states (ds) and of the outputs (dy).
  template <typename T>
  struct BackwardIn {
    const BackwardAt& at;
    const float (&bv)[kGb > 0 ? kGb : 1][kElemsPerThread];
    const float (&pv)[kP > 0 ? kP : 1][kElemsPerThread];
    const float (&ds)[kS][kElemsPerThread];
    __device__ __forceinline__ float state(int k) const {
      return at.a.hist[((((long long)at.t * kS + k) * at.a.NH + at.n) * at.a.B + at.gb) * kD + at.d];
    }
    __device__ __forceinline__ float wx(int k) const { return rnncc::to_float(static_cast<const T*>(at.a.Wx)[at.x + k * at.NHD]); }
    __device__ __forceinline__ float rh(int k) const { return at.a.rh[at.row * kRows + k * kD + at.d]; }
    __device__ __forceinline__ float bias(int k) const { return bv[k][at.q]; }
    __device__ __forceinline__ float param(int k) const { return pv[k][at.q]; }
    __device__ __forceinline__ float dstate(int k) const { return ds[k][at.q]; }
    __device__ __forceinline__ float dout(int o) const {
      return rnncc::to_float(static_cast<const T*>(at.a.dy)[at.y + o * (long long)at.a.B * at.a.T * at.NHD]);
    }
  };

  // Where its results go: the old states' cotangents into registers, dWx to global memory, the
  // gate cotangents to shared memory (the product's operand) and, in the storage type, to the
  // head-major dGr of the host's dR GEMM; bias and param cotangents summed over time in registers.
  template <typename T>
  struct BackwardOut {
    const BackwardAt& at;
    float (&nd)[kS][kElemsPerThread];
    float (&dgs)[kRows > 0 ? kRows : 1][kBC];
    float (&gbacc)[kGb > 0 ? kGb : 1][kElemsPerThread];
    float (&pacc)[kP > 0 ? kP : 1][kElemsPerThread];
    int b;
    __device__ __forceinline__ void d_state(int k, float v) const { nd[k][at.q] = v; }
    __device__ __forceinline__ void d_wx(int k, float v) const { static_cast<T*>(at.a.dWx)[at.x + k * at.NHD] = rnncc::from_float<T>(v); }
    __device__ __forceinline__ void d_rh(int k, float v) const {
      dgs[k * kD + at.d][b] = v;
      static_cast<T*>(at.a.dGr)[at.grow * kRows + k * kD + at.d] = rnncc::from_float<T>(v);
    }
    __device__ __forceinline__ void d_bias(int k, float v) const { gbacc[k][at.q] += v; }
    __device__ __forceinline__ void d_param(int k, float v) const { pacc[k][at.q] += v; }
  };

  template <typename T>
  static __device__ __forceinline__ void forward(const rnncc_fused_args& a) {
    __shared__ __align__(16) float hs[kD][kBC];
    __shared__ float rhs[kBC][kRows > 0 ? kRows : 1];
    const int tid = threadIdx.x;
    const int n = blockIdx.x;
    const int b0 = blockIdx.y * kBC;
    const int rev = kTimeline && rnncc::reversed(a, n);  // this head runs reversed
    const long long NHD = (long long)a.NH * kD;
    const T* bias = static_cast<const T*>(a.bias) + (long long)n * kD;
    const T* states = static_cast<const T*>(a.states);

    float rrow[kRows > 0 ? kD : 1];
    if (kRows > 0 && tid < kRows) {
      const int g = tid / kD, dout = tid % kD;
      const T* R = static_cast<const T*>(a.R) + (((long long)g * a.NH + n) * kD + dout) * kD;
#pragma unroll
      for (int e = 0; e < kD; ++e) rrow[e] = rnncc::to_float(R[e]);
    }

    float st[kS][kElemsPerThread];
    float pv[kP > 0 ? kP : 1][kElemsPerThread];
    float bv[kGb > 0 ? kGb : 1][kElemsPerThread];
    int len[kTimeline ? kElemsPerThread : 1];  // the elements' row lengths (kTimeline)
#pragma unroll
    for (int q = 0; q < kElemsPerThread; ++q) {
      const int j = tid + q * kThreads;
      const int b = j / kD, d = j % kD, gb = b0 + b;
      const bool live = j < kElems && gb < a.B;
      if constexpr (kTimeline) len[q] = rnncc::row_length(a.lengths, a.T, gb, live);
#pragma unroll
      for (int s = 0; s < kS; ++s) {
        st[s][q] = live ? rnncc::to_float(states[(((long long)s * a.B + gb) * a.NH + n) * kD + d]) : 0.0f;
        if (live && a.hist) a.hist[(((long long)s * a.NH + n) * a.B + gb) * kD + d] = st[s][q];
      }
#pragma unroll
      for (int k = 0; k < kGb; ++k) bv[k][q] = j < kElems ? rnncc::to_float(bias[k * NHD + d]) : 0.0f;
#pragma unroll
      for (int p = 0; p < kP; ++p)
        pv[p][q] = j < kElems ? rnncc::to_float(static_cast<const T*>(a.params)[((long long)p * a.NH + n) * kD + d]) : 0.0f;
      if (kGr > 0 && j < kElems) hs[d][b] = st[kRec][q];
    }
    __syncthreads();

    for (int t = 0; t < a.T; ++t) {
      // This step's W x, loaded before R·h so that the loads' latency hides behind it.
      float wxv[kGx > 0 ? kGx : 1][kElemsPerThread];
#pragma unroll
      for (int q = 0; q < kElemsPerThread; ++q) {
        const int j = tid + q * kThreads;
        const int b = j / kD, d = j % kD, gb = b0 + b;
        const int p = kTimeline ? rnncc::position(len[q], rev, t) : t;
        const T* Wx = static_cast<const T*>(a.Wx) + (((long long)gb * a.T + p) * kGx) * NHD + (long long)n * kD + d;
#pragma unroll
        for (int k = 0; k < kGx; ++k) wxv[k][q] = (j < kElems && gb < a.B) ? rnncc::to_float(Wx[k * NHD]) : 0.0f;
      }
      if (kRows > 0) {
        if (tid < kRows) {
          float acc[kBC];
#pragma unroll
          for (int c = 0; c < kBC; ++c) acc[c] = 0.0f;
#pragma unroll
          for (int e = 0; e < kD; ++e) {
            const float r = rrow[e];
#pragma unroll
            for (int c = 0; c < kBC; c += 4) {
              const float4 h4 = *reinterpret_cast<const float4*>(&hs[e][c]);
              acc[c] = fmaf(r, h4.x, acc[c]);
              acc[c + 1] = fmaf(r, h4.y, acc[c + 1]);
              acc[c + 2] = fmaf(r, h4.z, acc[c + 2]);
              acc[c + 3] = fmaf(r, h4.w, acc[c + 3]);
            }
          }
#pragma unroll
          for (int c = 0; c < kBC; ++c) {
            rhs[c][tid] = acc[c];
            if (a.rh && b0 + c < a.B)
              a.rh[(((long long)t * a.NH + n) * a.B + b0 + c) * kRows + tid] = acc[c];
          }
        }
        __syncthreads();
      }
#pragma unroll
      for (int q = 0; q < kElemsPerThread; ++q) {
        const int j = tid + q * kThreads;
        const int b = j / kD, d = j % kD, gb = b0 + b;
        if (j < kElems && gb < a.B) {
          float next[kS];
          C::forward(ForwardIn{st, wxv, rhs, bv, pv, q, b, d}, next);
          const bool on = !kTimeline || t < len[q];  // else a held step: states kept, outputs 0
          const int p = kTimeline ? rnncc::position(len[q], rev, t) : t;
#pragma unroll
          for (int s = 0; s < kS; ++s) {
            if (!on) next[s] = st[s][q];
            st[s][q] = next[s];
          }
#pragma unroll
          for (int o = 0; o < kO; ++o)
            static_cast<T*>(a.y)[(((long long)o * a.B + gb) * a.T + p) * NHD + (long long)n * kD + d] =
                rnncc::from_float<T>(on ? next[C::output_state(o)] : 0.0f);
          if (a.hist) {
#pragma unroll
            for (int s = 0; s < kS; ++s) a.hist[((((long long)(t + 1) * kS + s) * a.NH + n) * a.B + gb) * kD + d] = next[s];
          }
          if (kGr > 0) hs[d][b] = next[kRec];
        }
      }
      __syncthreads();
    }

#pragma unroll
    for (int q = 0; q < kElemsPerThread; ++q) {
      const int j = tid + q * kThreads;
      const int b = j / kD, d = j % kD, gb = b0 + b;
      if (j < kElems && gb < a.B) {
#pragma unroll
        for (int s = 0; s < kS; ++s)
          static_cast<T*>(a.last)[(((long long)s * a.B + gb) * a.NH + n) * kD + d] = rnncc::from_float<T>(st[s][q]);
      }
    }
  }

  // kGroups (traits): row slices of the Rᵀ·dg product.
  static constexpr int kSlice = kRows > 0 ? (kRows + kGroups - 1) / kGroups : 1;
  static_assert(kRows == 0 || kGroups >= 1, "at least one thread per column of R");
  static_assert((kD * kBC * (kRows > 0 ? kGroups : 1) + kBC * (kRows > 0 ? kRows : 1)) * 4 <= 48 * 1024,
                "dg and the Rᵀ·dg partial sums must fit the 48 KiB of static shared memory");

  // Backward, block tier: per step from the last, the backward cell (C::backward) on this thread's
  // elements (old states from hist, gates from W x + saved R·h + b), then dh += Rᵀ·dg with the
  // rows of R split into kGroups slices (column `me` of R's slice in registers) and the slices'
  // partial sums added through shared memory.
  template <typename T>
  static __device__ __forceinline__ void backward(const rnncc_fused_bwd_args& a) {
    __shared__ __align__(16) float dgs[kRows > 0 ? kRows : 1][kBC];
    __shared__ __align__(16) float red[kRows > 0 ? kGroups : 1][kD][kBC];
    const int tid = threadIdx.x;
    const int n = blockIdx.x;
    const int b0 = blockIdx.y * kBC;
    const int rev = kTimeline && rnncc::reversed(a, n);  // this head runs reversed
    const long long NHD = (long long)a.NH * kD;
    const T* bias = static_cast<const T*>(a.bias) + (long long)n * kD;
    const int me = tid % kD, grp = tid / kD;
    const bool in_product = kRows > 0 && grp < kGroups;

    float rcol[kSlice];
#pragma unroll
    for (int i = 0; i < kSlice; ++i) {
      const int r = grp * kSlice + i;
      rcol[i] = 0.0f;
      if (in_product && r < kRows) {
        const int g = r / kD, dout = r % kD;
        rcol[i] = rnncc::to_float(static_cast<const T*>(a.R)[(((long long)g * a.NH + n) * kD + dout) * kD + me]);
      }
    }

    float ds[kS][kElemsPerThread];
    float pv[kP > 0 ? kP : 1][kElemsPerThread];
    float bv[kGb > 0 ? kGb : 1][kElemsPerThread];
    float gbacc[kGb > 0 ? kGb : 1][kElemsPerThread];  // the bias and param cotangents, summed over time
    float pacc[kP > 0 ? kP : 1][kElemsPerThread];
    int len[kTimeline ? kElemsPerThread : 1];  // the elements' row lengths (kTimeline)
#pragma unroll
    for (int q = 0; q < kElemsPerThread; ++q) {
      const int j = tid + q * kThreads;
      const int b = j / kD, d = j % kD, gb = b0 + b;
      const bool live = j < kElems && gb < a.B;
      if constexpr (kTimeline) len[q] = rnncc::row_length(a.lengths, a.T, gb, live);
#pragma unroll
      for (int s = 0; s < kS; ++s)
        ds[s][q] = live ? rnncc::to_float(static_cast<const T*>(a.dlast)[(((long long)s * a.B + gb) * a.NH + n) * kD + d]) : 0.0f;
#pragma unroll
      for (int k = 0; k < kGb; ++k) bv[k][q] = j < kElems ? rnncc::to_float(bias[k * NHD + d]) : 0.0f;
#pragma unroll
      for (int p = 0; p < kP; ++p)
        pv[p][q] = j < kElems ? rnncc::to_float(static_cast<const T*>(a.params)[((long long)p * a.NH + n) * kD + d]) : 0.0f;
#pragma unroll
      for (int k = 0; k < (kGb > 0 ? kGb : 1); ++k) gbacc[k][q] = 0.0f;
#pragma unroll
      for (int p = 0; p < (kP > 0 ? kP : 1); ++p) pacc[p][q] = 0.0f;
    }

    for (int t = a.T - 1; t >= 0; --t) {
      float nd[kS][kElemsPerThread];
#pragma unroll
      for (int q = 0; q < kElemsPerThread; ++q) {
        const int j = tid + q * kThreads;
        const int b = j / kD, d = j % kD, gb = b0 + b;
#pragma unroll
        for (int s = 0; s < kS; ++s) nd[s][q] = 0.0f;
        if (kTimeline && j < kElems && gb < a.B && t >= len[q]) {
          // A held step: the states' cotangents pass through; dWx (at position t) and dg are 0.
          const BackwardAt at(a, t, t, n, gb, d, q);
#pragma unroll
          for (int s = 0; s < kS; ++s) nd[s][q] = ds[s][q];
#pragma unroll
          for (int k = 0; k < kGx; ++k) static_cast<T*>(a.dWx)[at.x + k * at.NHD] = rnncc::from_float<T>(0.0f);
#pragma unroll
          for (int r = 0; r < kGr; ++r) {
            dgs[r * kD + d][b] = 0.0f;
            static_cast<T*>(a.dGr)[at.grow * kRows + r * kD + d] = rnncc::from_float<T>(0.0f);
          }
        } else if (j < kElems && gb < a.B) {
          const BackwardAt at(a, t, kTimeline ? rnncc::position(len[q], rev, t) : t, n, gb, d, q);
          C::backward(BackwardIn<T>{at, bv, pv, ds}, BackwardOut<T>{at, nd, dgs, gbacc, pacc, b});
        } else if (j < kElems) {
#pragma unroll
          for (int r = 0; r < kGr; ++r) dgs[r * kD + d][b] = 0.0f;
        }
      }
      __syncthreads();
      if (kRows > 0) {
        if (in_product) {
          float acc[kBC];
#pragma unroll
          for (int c = 0; c < kBC; ++c) acc[c] = 0.0f;
#pragma unroll
          for (int i = 0; i < kSlice; ++i) {
            const int r = grp * kSlice + i;
            if (r < kRows) {
              const float w = rcol[i];
#pragma unroll
              for (int c = 0; c < kBC; c += 4) {
                const float4 g4 = *reinterpret_cast<const float4*>(&dgs[r][c]);
                acc[c] = fmaf(w, g4.x, acc[c]);
                acc[c + 1] = fmaf(w, g4.y, acc[c + 1]);
                acc[c + 2] = fmaf(w, g4.z, acc[c + 2]);
                acc[c + 3] = fmaf(w, g4.w, acc[c + 3]);
              }
            }
          }
#pragma unroll
          for (int c = 0; c < kBC; ++c) red[grp][me][c] = acc[c];
        }
        __syncthreads();
      }
#pragma unroll
      for (int q = 0; q < kElemsPerThread; ++q) {
        const int j = tid + q * kThreads;
        const int b = j / kD, d = j % kD;
#pragma unroll
        for (int s = 0; s < kS; ++s) ds[s][q] = nd[s][q];
        if (kRows > 0 && j < kElems) {
          float sum = 0.0f;
#pragma unroll
          for (int g = 0; g < (kRows > 0 ? kGroups : 1); ++g) sum += red[g][d][b];
          ds[kRec][q] += sum;
        }
      }
    }

#pragma unroll
    for (int q = 0; q < kElemsPerThread; ++q) {
      const int j = tid + q * kThreads;
      const int b = j / kD, d = j % kD, gb = b0 + b;
      if (j < kElems && gb < a.B) {
#pragma unroll
        for (int s = 0; s < kS; ++s)
          static_cast<T*>(a.dstates)[(((long long)s * a.B + gb) * a.NH + n) * kD + d] = rnncc::from_float<T>(ds[s][q]);
#pragma unroll
        for (int k = 0; k < kGb; ++k) a.dGb[((long long)gb * a.NH + n) * (kGb * kD) + k * kD + d] = gbacc[k][q];
#pragma unroll
        for (int p = 0; p < kP; ++p) a.dP[((long long)gb * a.NH + n) * (kP * kD) + p * kD + d] = pacc[p][q];
      }
    }
  }

};

template <class C, typename T>
__global__ void __launch_bounds__(C::kThreads, 1) forward_kernel(const rnncc_fused_args a) {
  Kernels<C>::template forward<T>(a);
}

template <class C, typename T>
__global__ void __launch_bounds__(C::kThreads, 1) backward_kernel(const rnncc_fused_bwd_args a) {
  Kernels<C>::template backward<T>(a);
}

// The launch the plan gives (rnncc.variants.block_ffma): a block per (head, batch chunk) of
// C::kThreads threads, static shared memory only; another launch is refused, not run.
template <class C, typename Args>
bool planned(const Args& a, const rnncc_launch& l) {
  return l.kernel == 0 && l.threads == C::kThreads && l.smem == 0 && l.grid_x == a.NH &&
         l.grid_y == (a.B + C::kBC - 1) / C::kBC && l.grid_z == 1;
}

// The library's entry points (rnncc_abi.h: rnncc_fused_forward, rnncc_fused_backward): float32
// storage only, the plan never launches another dtype here.
template <class C>
int forward(const rnncc_fused_args* a, const rnncc_launch* l, cudaStream_t stream) {
  if (a->D != C::kD) return (int)cudaErrorInvalidValue;
  if ((long long)a->NH * a->B == 0) return 0;
  if (!planned<C>(*a, *l)) return (int)cudaErrorInvalidValue;
  if (a->dtype != RNNCC_F32) return (int)cudaErrorNotSupported;
  forward_kernel<C, float><<<dim3((unsigned)l->grid_x, (unsigned)l->grid_y), C::kThreads, 0, stream>>>(*a);
  return (int)cudaGetLastError();
}

template <class C>
int backward(const rnncc_fused_bwd_args* a, const rnncc_launch* l, cudaStream_t stream) {
  if (a->D != C::kD) return (int)cudaErrorInvalidValue;
  if ((long long)a->NH * a->B == 0) return 0;
  if (!planned<C>(*a, *l)) return (int)cudaErrorInvalidValue;
  if (a->dtype != RNNCC_F32) return (int)cudaErrorNotSupported;
  backward_kernel<C, float><<<dim3((unsigned)l->grid_x, (unsigned)l->grid_y), C::kThreads, 0, stream>>>(*a);
  return (int)cudaGetLastError();
}

}  // namespace block_ffma
}  // namespace rnncc
