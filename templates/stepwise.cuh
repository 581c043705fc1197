// The stepwise variant's kernels: per step, one thread per (head, batch row, unit) runs the
// cell's forward or backward on its element, float32 math for every storage dtype; the host
// loop (stepwise_host.cpp) runs R·h and dR as GEMMs between the steps. Templated on the
// generated cell struct C (its shape, kThreads, and the hooks forward and backward). Per-row
// lengths and the reverse direction (rnncc_abi.h) are read at run time: a step is one element.
// The library also holds the decoding step (decode.cuh), for any size.
#pragma once
#include "decode.cuh"
#include "rnncc_abi.h"
#include "rnncc_ops.cuh"
#include "timeline.cuh"

namespace rnncc {
namespace stepwise {

template <class C>
struct Kernels {
  static constexpr int kS = C::kS, kO = C::kO, kGx = C::kGx, kGr = C::kGr, kGb = C::kGb, kP = C::kP;
  static_assert(kS >= 1, "a cell has at least one state");
  static_assert(kO >= 1 && kO <= kS && C::kRec >= 0 && C::kRec < kS, "the outputs and the recurrent state are some of the states");
  static_assert(kGx >= 0 && kGr >= 0 && kGb >= 0 && kP >= 0, "gate and param counts are non-negative");

  // Element i = (head n, batch row b, unit d) of step a.t, and its offsets: x into W x and
  // dWx, y into y and dy (at the row's position of the step), hd into bias and params; Rh and
  // the per-element cotangents are [NH, B, gates, D]: (head, row) nb, unit d. live: the step
  // is one of the row's (else it holds the states).
  struct Element {
    long long NHD, NBD, yO, i, x, y, hd, nb;
    int d;
    bool live;
    __device__ explicit Element(const rnncc_step_args& a) {
      NHD = (long long)a.NH * a.D;
      NBD = NHD * a.B;
      yO = (long long)a.B * a.T * NHD;  // one output of y
      i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
      d = (int)(i % a.D);
      const int b = (int)((i / a.D) % a.B), n = (int)(i / ((long long)a.D * a.B));
      const int L = row_length(a.lengths, a.T, b, i < NBD);
      live = a.t < L;
      const long long bt = (long long)b * a.T + position(L, reversed(a, n), a.t);
      hd = (long long)n * a.D + d;
      x = bt * kGx * NHD + hd;
      y = bt * NHD + hd;
      nb = (long long)n * a.B + b;
    }
  };

  // What the cell reads: the old states, the gates' parts, the params; in the backward, the
  // cotangents of the new states and of the outputs.
  template <typename T>
  struct In {
    const rnncc_step_args& a;
    const Element& e;
    __device__ __forceinline__ float state(int k) const { return a.s_old[k * e.NBD + e.i]; }
    __device__ __forceinline__ float wx(int k) const { return to_float(static_cast<const T*>(a.Wx)[e.x + k * e.NHD]); }
    __device__ __forceinline__ float rh(int k) const { return a.Rh[(e.nb * kGr + k) * a.D + e.d]; }
    __device__ __forceinline__ float bias(int k) const { return to_float(static_cast<const T*>(a.bias)[e.hd + k * e.NHD]); }
    __device__ __forceinline__ float param(int k) const { return to_float(static_cast<const T*>(a.params)[e.hd + k * e.NHD]); }
    __device__ __forceinline__ float dstate(int k) const { return a.ds_new[k * e.NBD + e.i]; }
    __device__ __forceinline__ float dout(int o) const { return to_float(static_cast<const T*>(a.dy)[e.y + o * e.yO]); }
  };

  // Where the backward cell's results go: per step, per element (the host sums dGb and dP).
  template <typename T>
  struct Out {
    const rnncc_step_args& a;
    const Element& e;
    __device__ __forceinline__ void d_state(int k, float v) const { a.ds_old[k * e.NBD + e.i] = v; }
    __device__ __forceinline__ void d_wx(int k, float v) const { static_cast<T*>(a.dWx)[e.x + k * e.NHD] = from_float<T>(v); }
    __device__ __forceinline__ void d_rh(int k, float v) const { a.dGr[(e.nb * kGr + k) * a.D + e.d] = v; }
    __device__ __forceinline__ void d_bias(int k, float v) const { a.dGb[(e.nb * kGb + k) * a.D + e.d] = v; }
    __device__ __forceinline__ void d_param(int k, float v) const { a.dP[(e.nb * kP + k) * a.D + e.d] = v; }
  };

  template <typename T>
  static __device__ __forceinline__ void forward(const rnncc_step_args& a) {
    const Element e(a);
    if (e.i >= e.NBD) return;
    float next[kS];
    if (e.live) {
      C::forward(In<T>{a, e}, next);
    } else {  // a held step: the states stay, the outputs are 0
#pragma unroll
      for (int k = 0; k < kS; ++k) next[k] = a.s_old[k * e.NBD + e.i];
    }
#pragma unroll
    for (int k = 0; k < kS; ++k) a.s_new[k * e.NBD + e.i] = next[k];
#pragma unroll
    for (int o = 0; o < kO; ++o)
      static_cast<T*>(a.y)[e.y + o * e.yO] = from_float<T>(e.live ? next[C::output_state(o)] : 0.0f);
  }

  template <typename T>
  static __device__ __forceinline__ void backward(const rnncc_step_args& a) {
    const Element e(a);
    if (e.i >= e.NBD) return;
    const Out<T> out{a, e};
    if (e.live) {
      C::backward(In<T>{a, e}, out);
      return;
    }
    // A held step: the states' cotangents pass through, every other cotangent is 0.
#pragma unroll
    for (int k = 0; k < kS; ++k) out.d_state(k, a.ds_new[k * e.NBD + e.i]);
#pragma unroll
    for (int k = 0; k < kGx; ++k) out.d_wx(k, 0.0f);
#pragma unroll
    for (int k = 0; k < kGr; ++k) out.d_rh(k, 0.0f);
#pragma unroll
    for (int k = 0; k < kGb; ++k) out.d_bias(k, 0.0f);
#pragma unroll
    for (int k = 0; k < kP; ++k) out.d_param(k, 0.0f);
  }
};

template <class C, typename T>
__global__ void __launch_bounds__(C::kThreads) forward_kernel(const rnncc_step_args a) {
  Kernels<C>::template forward<T>(a);
}

template <class C, typename T>
__global__ void __launch_bounds__(C::kThreads) backward_kernel(const rnncc_step_args a) {
  Kernels<C>::template backward<T>(a);
}

template <class C>
int launch(void (*f32)(rnncc_step_args), void (*f16)(rnncc_step_args), void (*bf16)(rnncc_step_args),
           const rnncc_step_args* a, cudaStream_t stream) {
  const long long n = (long long)a->NH * a->B * a->D;
  if (n == 0) return 0;
  const unsigned blocks = (unsigned)((n + C::kThreads - 1) / C::kThreads);
  switch (a->dtype) {
    case RNNCC_F32: f32<<<blocks, C::kThreads, 0, stream>>>(*a); break;
    case RNNCC_F16: f16<<<blocks, C::kThreads, 0, stream>>>(*a); break;
    case RNNCC_BF16: bf16<<<blocks, C::kThreads, 0, stream>>>(*a); break;
    default: return (int)cudaErrorInvalidValue;
  }
  return (int)cudaGetLastError();
}

// The library's entry points (rnncc_abi.h: rnncc_forward_step, rnncc_backward_step, rnncc_decode).
template <class C>
int forward(const rnncc_step_args* a, cudaStream_t stream) {
  return launch<C>(forward_kernel<C, float>, forward_kernel<C, __half>, forward_kernel<C, __nv_bfloat16>, a, stream);
}
template <class C>
int backward(const rnncc_step_args* a, cudaStream_t stream) {
  return launch<C>(backward_kernel<C, float>, backward_kernel<C, __half>, backward_kernel<C, __nv_bfloat16>, a, stream);
}
template <class C>
int decode(const rnncc_decode_args* a, cudaStream_t stream) {
  return rnncc::decode::step<C>(a, stream);
}

}  // namespace stepwise
}  // namespace rnncc
