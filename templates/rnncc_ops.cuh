// rnncc device helpers: the CUDA spelling of the op table (rnncc/ir/ops.py), in float32.
// Each helper mirrors the torch reference of its op, edge cases included; see the notes.
// Fast intrinsics are used only where their error stays far below the float32 tolerance of
// the tests (relative 1e-5 after hundreds of steps): __expf in exp and sigmoid (2 ulp plus
// a term growing with |x|; the gates' pre-activations are O(10)). tanh, log, log1p, sqrt
// and pow use the accurate library functions.
#pragma once
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>

namespace rnncc {

template <typename T> __device__ __forceinline__ float to_float(T v);
template <> __device__ __forceinline__ float to_float<float>(float v) { return v; }
template <> __device__ __forceinline__ float to_float<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 v) {
  return __bfloat162float(v);
}

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

}  // namespace rnncc

__device__ __forceinline__ float rnncc_exp(float x) { return __expf(x); }
__device__ __forceinline__ float rnncc_sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }
__device__ __forceinline__ float rnncc_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ float rnncc_log(float x) { return logf(x); }
// Stable forms, as torch evaluates them: log σ(x) = min(x, 0) - log1p(exp(-|x|)).
__device__ __forceinline__ float rnncc_logsigmoid(float x) {
  return fminf(x, 0.0f) - log1pf(__expf(-fabsf(x)));
}
// torch.nn.functional.softplus (beta 1, threshold 20): the identity above the threshold.
__device__ __forceinline__ float rnncc_softplus(float x) {
  return x > 20.0f ? x : log1pf(__expf(x));
}
// torch.relu keeps NaN; x < 0 is false for NaN.
__device__ __forceinline__ float rnncc_relu(float x) { return x < 0.0f ? 0.0f : x; }
__device__ __forceinline__ float rnncc_sqrt(float x) { return sqrtf(x); }
// torch.maximum / torch.minimum propagate NaN from either side (fmaxf would drop it).
__device__ __forceinline__ float rnncc_max(float a, float b) { return (a != a || a > b) ? a : b; }
__device__ __forceinline__ float rnncc_min(float a, float b) { return (a != a || a < b) ? a : b; }

// Faster forms for the 16-bit (bf16 / fp16) tensor-core kernels, whose storage resolution is
// 2^-8 (bf16) or 2^-11 (fp16): the hardware tanh (tanh.approx.f32, one MUFU op, relative error
// about 2^-11), the sigmoid on it (absolute error about 2^-12), and log, log σ
// and softplus on the fast logarithm (__logf) instead of logf / log1pf. The generated cell
// hooks of the 16-bit variants take them with block-scope using-declarations, which hide the
// accurate ones above in that hook only.
namespace rnncc {
namespace fast {
__device__ __forceinline__ float rnncc_tanh(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// σ(x) = (1 + tanh(x / 2)) / 2: one MUFU op, where exp and the reciprocal take two.
__device__ __forceinline__ float rnncc_sigmoid(float x) { return fmaf(0.5f, rnncc_tanh(0.5f * x), 0.5f); }
// __logf: absolute error below 2^-21 near 1, 2 ulp elsewhere. In log σ(x), log1p(e) for a tiny
// e = exp(-|x|) becomes log(1 + e), which loses e < 2^-24 (absolute).
__device__ __forceinline__ float rnncc_log(float x) { return __logf(x); }
__device__ __forceinline__ float rnncc_logsigmoid(float x) {
  return fminf(x, 0.0f) - __logf(1.0f + __expf(-fabsf(x)));
}
__device__ __forceinline__ float rnncc_softplus(float x) {
  return x > 20.0f ? x : __logf(1.0f + __expf(x));
}
}  // namespace fast
}  // namespace rnncc
