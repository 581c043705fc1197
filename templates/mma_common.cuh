// Shared by the tensor-core kernels of both tiers (block_mma.cuh, grid_mma.cuh), templated on
// the generated cell struct C: the head dim padded to whole mma tiles, R's elements, a lane's
// two adjacent units, the backward's step inputs and sums, and what the cell's hooks
// (C::forward, C::backward) read and write for a lane's element q.
#pragma once
#include <type_traits>

#include "rnncc_abi.h"
#include "rnncc_mma.cuh"
#include "rnncc_ops.cuh"

namespace rnncc {

template <class C>
struct MmaCommon {
  static constexpr int kS = C::kS, kO = C::kO, kGx = C::kGx, kGr = C::kGr, kGb = C::kGb, kP = C::kP, kRec = C::kRec;
  static constexpr int kD = C::kD, kBC = C::kBC;
  static constexpr int kRows = kGr * kD;
  static_assert(kO >= 1 && kO <= kS && kRec >= 0 && kRec < kS, "the outputs and the recurrent state are some of the states");
  static_assert(kGx >= 0 && kGb >= 0 && kP >= 0, "gate and param counts are non-negative");

  static constexpr int kKP = (kD + 15) / 16 * 16;  // the head dim padded to whole k tiles
  static constexpr int kKTiles = kKP / 16;  // k tiles of R·h
  static constexpr int kPairs = (kGr + 1) / 2 > 0 ? (kGr + 1) / 2 : 1;  // m tiles of R·h: gate pairs
  static constexpr int kGRows = (kGr > 0 ? kGr : 1) * kKP;  // k of dgᵀ·R: gate rows, gate-major
  static constexpr int kGTiles = kGRows / 16;
  static constexpr bool kPaired = kD % 2 == 0;  // backward: a lane's two units as one aligned access

  // One element of R[gate][n] (out x in) as float; zero outside the cell (the padding).
  template <typename T>
  static __device__ __forceinline__ float r_at(const T* R, int NH, int n, int gate, int out, int in) {
    return (gate < kGr && out < kD && in < kD) ? rnncc::to_float(R[(((long long)gate * NH + n) * kD + out) * kD + in]) : 0.0f;
  }

  // A lane's two adjacent units p[0], p[1] (backward): one access when the head dim is even
  // (both are inside it or neither is); else two, reading p[0] again for a second unit past the
  // head dim (hi false) and storing it only when inside, so no address outside the tensor is used.
  template <typename E>
  static __device__ __forceinline__ void get2(const E* p, bool hi, E& lo_v, E& hi_v) {
    if constexpr (kPaired) {
      rnncc::load_pair(p, lo_v, hi_v);
    } else {
      lo_v = p[0];
      hi_v = p[hi ? 1 : 0];
    }
  }
  template <typename E>
  static __device__ __forceinline__ void put2(E* p, bool hi, E lo_v, E hi_v) {
    if constexpr (kPaired) {
      rnncc::store_pair(p, lo_v, hi_v);
    } else {
      p[0] = lo_v;
      if (hi) p[1] = hi_v;
    }
  }

  // Inputs loaded ahead stay in their 32-bit registers exactly as loaded until the cell reads
  // them: any operation on a loaded value, even merging two 16-bit halves into one register,
  // waits for the load, and would bring a memory latency back into every step.
  //
  // bits_float: the T in the low bits of w (a load of one element), as float.
  template <typename T>
  static __device__ __forceinline__ float bits_float(const uint32_t w) {
    if constexpr (std::is_same<T, float>::value) {
      return __uint_as_float(w);
    } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
      return __uint_as_float(w << 16);
    } else {
      return rnncc::to_float(__ushort_as_half((unsigned short)(w & 0xffffu)));
    }
  }
  // A lane's two adjacent units as loaded by get2_raw: 16-bit, one 32-bit word (w[0]) when the
  // head dim is even, else one element per word; fp32, one element per word (one 8-byte load
  // when the head dim is even).
  template <typename T>
  static __device__ __forceinline__ void get2_raw(const T* p, bool hi, uint32_t (&w)[2]) {
    typedef typename rnncc::Operand<T>::Bits Bits;
    if constexpr (kPaired && sizeof(T) == 4) {
      const uint2 v = *reinterpret_cast<const uint2*>(p);
      w[0] = v.x;
      w[1] = v.y;
    } else if constexpr (kPaired) {
      w[0] = *reinterpret_cast<const uint32_t*>(p);
      w[1] = 0u;
    } else {
      w[0] = *reinterpret_cast<const Bits*>(p);
      w[1] = *reinterpret_cast<const Bits*>(p + (hi ? 1 : 0));
    }
  }
  template <typename T>
  static __device__ __forceinline__ float raw_float(const uint32_t (&w)[2], const int q) {
    if constexpr (kPaired && sizeof(T) == 2) {
      return q == 0 ? bits_float<T>(w[0]) : bits_float<T>(w[0] >> 16);
    } else {
      return bits_float<T>(w[q]);
    }
  }

  // What the backward cell of one step reads from global memory for a lane's two elements
  // (batch row gb, units d0 and d0 + 1): W x and dy raw (get2_raw), converted where the cell
  // reads them (raw_float). The grid tier loads them with load_step_inputs, the block tier
  // reads them from its shared-memory ring (block_mma.cuh).
  template <typename T>
  struct StepInputs {
    float s[kS][2];
    uint32_t wx[kGx > 0 ? kGx : 1][2];
    float rh[kGr > 0 ? kGr : 1][2];
    uint32_t dy[kO][2];
  };

  // Step t's inputs of the lane (batch row gb of head n, units d0 and d0 + 1). The loads are
  // unconditional, as in the forwards' W x loads: masked elements read element 0; a lane's
  // two elements are adjacent units (get2).
  // W x and dy are read at position p of the row (t, or the row's position of step t); p < 0
  // (a held step, whose are unused) reads them from element 0.
  template <typename T>
  static __device__ __forceinline__ void load_step_inputs(const rnncc_fused_bwd_args& a, const int t, const int p,
                                                   const int n, const int gb, const int d0, StepInputs<T>& in) {
    const long long NHD = (long long)a.NH * kD, yO = (long long)a.B * a.T * NHD;
    const long long row = ((long long)t * a.NH + n) * a.B + gb;
    const bool live = d0 < kD && gb < a.B, hi = d0 + 1 < kD;
    const bool at_p = live && p >= 0;
    const long long x_at = at_p ? (((long long)gb * a.T + p) * kGx) * NHD + (long long)n * kD + d0 : 0;
    const long long y_at = at_p ? ((long long)gb * a.T + p) * NHD + (long long)n * kD + d0 : 0;
    const long long s_at = live ? ((long long)t * kS * a.NH + n) * a.B * kD + (long long)gb * kD + d0 : 0;
    const long long rh_at = live ? row * kRows + d0 : 0;
#pragma unroll
    for (int s = 0; s < kS; ++s) get2(a.hist + s_at + (long long)s * a.NH * a.B * kD, hi, in.s[s][0], in.s[s][1]);
#pragma unroll
    for (int k = 0; k < kGx; ++k) get2_raw(static_cast<const T*>(a.Wx) + x_at + k * NHD, hi, in.wx[k]);
#pragma unroll
    for (int k = 0; k < kGr; ++k) get2(a.rh + rh_at + k * kD, hi, in.rh[k][0], in.rh[k][1]);
#pragma unroll
    for (int o = 0; o < kO; ++o) get2_raw(static_cast<const T*>(a.dy) + y_at + o * yO, hi, in.dy[o]);
  }

  // The bias and param cotangents of a lane's two elements (batch row gb, units d0 and d0 + 1),
  // summed over time in registers (a lane keeps its elements for the whole sequence) and stored
  // once after the loop, one row per batch row: dGb [B, NH, Gb * D] and dP [B, NH, P * D]
  // (float); the host sums over the batch.
  struct SumOverTime {
    float gb[kGb > 0 ? kGb : 1][2] = {};
    float p[kP > 0 ? kP : 1][2] = {};

    __device__ __forceinline__ void add(const float (&dgb)[kGb > 0 ? kGb : 1][2], const float (&dp)[kP > 0 ? kP : 1][2]) {
#pragma unroll
      for (int k = 0; k < kGb; ++k) {
        gb[k][0] += dgb[k][0];
        gb[k][1] += dgb[k][1];
      }
#pragma unroll
      for (int k = 0; k < kP; ++k) {
        p[k][0] += dp[k][0];
        p[k][1] += dp[k][1];
      }
    }

    __device__ __forceinline__ void store(const rnncc_fused_bwd_args& a, const int n, const int row, const int d0) const {
      const bool hi = d0 + 1 < kD;
      const long long at = (long long)row * a.NH + n;
#pragma unroll
      for (int k = 0; k < kGb; ++k) put2(a.dGb + at * (kGb * kD) + k * kD + d0, hi, gb[k][0], gb[k][1]);
#pragma unroll
      for (int k = 0; k < kP; ++k) put2(a.dP + at * (kP * kD) + k * kD + d0, hi, p[k][0], p[k][1]);
    }
  };

  // What the forward cell reads for a lane's element q: the states in registers, W x raw as
  // loaded (converted where the cell reads it), R·h from the product's accumulators (gate k
  // in pair k / 2, row half k % 2), biases and params in registers.
  template <typename T>
  struct ForwardIn {
    const float (&st)[kS][2];
    const uint32_t (&wxv)[kGx > 0 ? kGx : 1][2];
    const float (&acc)[kPairs][4];
    const float (&bv)[kGb > 0 ? kGb : 1][2];
    const float (&pv)[kP > 0 ? kP : 1][2];
    int q;
    __device__ __forceinline__ float state(int k) const { return st[k][q]; }
    __device__ __forceinline__ float wx(int k) const { return bits_float<T>(wxv[k][q]); }
    __device__ __forceinline__ float rh(int k) const { return acc[k / 2][k % 2 * 2 + q]; }
    __device__ __forceinline__ float bias(int k) const { return bv[k][q]; }
    __device__ __forceinline__ float param(int k) const { return pv[k][q]; }
  };

  // The backward cell's results for a lane's two elements, stored after both are done (as
  // pairs: the two are adjacent units).
  struct StepResults {
    float wx[kGx > 0 ? kGx : 1][2], gr[kGr > 0 ? kGr : 1][2], gb[kGb > 0 ? kGb : 1][2], p[kP > 0 ? kP : 1][2];
  };

  // A held step of a lane's row (rnncc_abi.h: past its length): the states' cotangents pass
  // through, every other result is 0 (stored as the cell's would be: dWx at position t).
  static __device__ __forceinline__ void hold(const float (&ds)[kS][2], float (&nd)[kS][2], StepResults& o) {
#pragma unroll
    for (int q = 0; q < 2; ++q) {
#pragma unroll
      for (int s = 0; s < kS; ++s) nd[s][q] = ds[s][q];
#pragma unroll
      for (int k = 0; k < (kGx > 0 ? kGx : 1); ++k) o.wx[k][q] = 0.0f;
#pragma unroll
      for (int k = 0; k < (kGr > 0 ? kGr : 1); ++k) o.gr[k][q] = 0.0f;
#pragma unroll
      for (int k = 0; k < (kGb > 0 ? kGb : 1); ++k) o.gb[k][q] = 0.0f;
#pragma unroll
      for (int k = 0; k < (kP > 0 ? kP : 1); ++k) o.p[k][q] = 0.0f;
    }
  }

  // What the backward cell reads for a lane's element q: the step's inputs (cur), biases and
  // params from shared memory (rows of kLen units from the element's: b, p), ds.
  template <typename T, int kLen>
  struct BackwardIn {
    const StepInputs<T>& cur;
    const float* b;  // [kGb][kLen]
    const float* p;  // [kP][kLen]
    const float (&ds)[kS][2];
    int q;
    __device__ __forceinline__ float state(int k) const { return cur.s[k][q]; }
    __device__ __forceinline__ float wx(int k) const { return raw_float<T>(cur.wx[k], q); }
    __device__ __forceinline__ float rh(int k) const { return cur.rh[k][q]; }
    __device__ __forceinline__ float bias(int k) const { return b[k * kLen]; }
    __device__ __forceinline__ float param(int k) const { return p[k * kLen]; }
    __device__ __forceinline__ float dstate(int k) const { return ds[k][q]; }
    __device__ __forceinline__ float dout(int o) const { return raw_float<T>(cur.dy[o], q); }
  };

  struct BackwardOut {
    float (&nd)[kS][2];
    StepResults& o;
    int q;
    __device__ __forceinline__ void d_state(int k, float v) const { nd[k][q] = v; }
    __device__ __forceinline__ void d_wx(int k, float v) const { o.wx[k][q] = v; }
    __device__ __forceinline__ void d_rh(int k, float v) const { o.gr[k][q] = v; }
    __device__ __forceinline__ void d_bias(int k, float v) const { o.gb[k][q] = v; }
    __device__ __forceinline__ void d_param(int k, float v) const { o.p[k][q] = v; }
  };
};

}  // namespace rnncc
