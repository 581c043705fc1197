// The block_mma variant's kernels (bf16 / fp16 storage): mma.sync m16n8k16 with fp32 accumulators.
// Warp w owns the units [8w, 8w + 8) of the head and keeps their part of R in registers, as
// mma fragments, for the whole sequence; a lane runs the cell (C::forward) on two elements, and
// the product's accumulators land in the lane that needs them (g = lane / 4, c = lane % 4):
//
// - forward, R·h: A = R with the 16 rows of a tile being two gates of the warp's 8 units
//   (gates 2p and 2p + 1 of tile p), B = h (k = unit, n = batch row), so a lane holds every
//   gate of unit 8w + g for batch rows 2c and 2c + 1;
// - backward, (Rᵀ·dg)ᵀ = dgᵀ·R: A = dg (m = batch row, padded from 8 to 16 with zeros,
//   k = gate row), B = R (n = the warp's 8 units), so a lane holds dh of batch row g for
//   units 8w + 2c and 8w + 2c + 1 — the elements it runs the backward cell on.
//
// h (forward) and dg (backward) go through shared memory as the next product's operand,
// double-buffered, so a step has one block barrier. The head dim is padded with zeros to
// whole tiles. The forward's W x (3 steps ahead) and the backward's inputs (2 steps ahead)
// are copied into rings in shared memory by cp.async.
// The cell's hooks take the fast forms of tanh, sigmoid, log, log σ and softplus
// (rnncc_ops.cuh), well inside 16-bit resolution.
// Templated on the generated cell struct C: the cell's shape, kD, kBC (8), and the plan's
// kWarps, kMmaThreads, kWxAhead, kWxRow, the backward's ring (kInAhead, kIn*, kBwSmem) and
// kTimeline (per-row lengths and the reverse direction, rnncc_abi.h: a row's W x, y and their
// cotangents copied at its positions, held steps past its length).
#pragma once
#include <atomic>

#include "mma_common.cuh"
#include "timeline.cuh"

namespace rnncc {
namespace block_mma {

template <class C>
struct Kernels : MmaCommon<C> {
  using Base = MmaCommon<C>;
  using Base::kS, Base::kO, Base::kGx, Base::kGr, Base::kGb, Base::kP, Base::kRec, Base::kD, Base::kBC, Base::kRows;
  using Base::kKP, Base::kKTiles, Base::kPairs, Base::kGRows, Base::kGTiles, Base::kPaired;
  using Base::r_at, Base::get2, Base::put2, Base::bits_float, Base::get2_raw, Base::raw_float, Base::hold;
  using typename Base::SumOverTime, typename Base::StepResults, typename Base::BackwardOut;
  template <typename T>
  using StepInputs = typename Base::template StepInputs<T>;
  template <typename T>
  using ForwardIn = typename Base::template ForwardIn<T>;
  template <typename T, int kLen>
  using BackwardIn = typename Base::template BackwardIn<T, kLen>;
  static constexpr int kWarps = C::kWarps, kMmaThreads = C::kMmaThreads, kWxAhead = C::kWxAhead, kWxRow = C::kWxRow;
  static constexpr int kInAhead = C::kInAhead, kInS = C::kInS, kInR = C::kInR, kInX = C::kInX, kInY = C::kInY;
  static constexpr int kInOffR = C::kInOffR, kInOffX = C::kInOffX, kInOffY = C::kInOffY, kInSlot = C::kInSlot;
  static constexpr size_t kBwSmem = C::kBwSmem;
  static constexpr bool kTimeline = C::kTimeline;

  static_assert(kWarps * 8 >= kD && kMmaThreads == 32 * kWarps, "a warp per 8 units (traits)");
  static constexpr int kHStride = kKP + 8;  // one batch row of h in shared memory (+8: no bank conflicts)
  static constexpr int kGStride = kGRows + 8;  // one batch row of dg in shared memory, likewise
  static constexpr int kChains = kGTiles < 4 ? kGTiles : 4;  // independent accumulators of dgᵀ·R
  static_assert(kBC == 8, "the batch chunk is the n = 8 (forward) and the m = 8 + 8 (backward) side");

  // The forward's W x goes through shared memory: step t's kBC batch rows x kGx gates x kD
  // units, copied by cp.async kWxAhead steps ahead into slot t % kWxSlots of a ring, whole
  // 16-byte pieces where the head dim allows (a row of one gate is kD adjacent elements). The
  // copies hold no registers and are waited for by count (cp.async.wait_group), so a step waits
  // only for its own W x, however long its copies took.
  // kWxAhead (traits): the steps copied ahead.
  static constexpr int kWxSlots = kWxAhead + 1;  // the slot written at step t was last read at step t - 1
  static constexpr int kWxChunk = kD % 8 == 0 ? 16 : kD % 4 == 0 ? 8 : kD % 2 == 0 ? 4 : 2;  // bytes per copy
  static constexpr int kWxPieces = kD * 2 / kWxChunk;  // copies per (batch row, gate)
  // kWxRow (traits): a batch row's bytes in the ring, padded to 16 (mod 128): the rows 2c and
  // 2c + 2 that a warp's lanes read at once then fall in different banks.
  static_assert(kWxRow >= (kGx > 0 ? kGx : 1) * kD * 2 && kWxRow % 16 == 0, "a W x row fits its padded row");
  static constexpr int kWxMine = (kBC * kGx * kWxPieces + kMmaThreads - 1) / kMmaThreads;  // copies per thread

  // The backward's inputs go the same way: step t's saved states and R·h (float), W x and dy
  // (16-bit) of the block's kBC batch rows, copied kInAhead steps ahead (the loop runs down from
  // the last step) into slot t % kInSlots of a ring in dynamic shared memory. Each input is
  // parts x kBC rows of kD units (a state, a gate, an output), a part's row padded to 32
  // (float) or 16 (16-bit) bytes past a multiple of 128, so that a warp's reads (8 rows, a lane
  // two adjacent units) fall in different banks.
  // The ring's layout comes from the plan (traits): kInAhead steps ahead, rows of kInS, kInR
  // (float) and kInX, kInY (16-bit) bytes, a slot's parts at 0, kInOffR, kInOffX, kInOffY (states,
  // then R·h, W x, dy), kInSlot bytes a slot (16 past the parts: a masked lane's pair read past the
  // last row), kBwSmem bytes in all.
  static constexpr int kInSlots = kInAhead + 1;  // the slot written at step t was last read at step t + 1
  static_assert(kInS >= kD * 4 && kInX >= kD * 2 && kInOffY + kO * kBC * kInY < kInSlot &&
                    kBwSmem == (size_t)kInSlots * kInSlot,
                "the ring's rows hold a head dim and its slots every part");

  template <typename T>
  static __device__ __forceinline__ void forward(const rnncc_fused_args& a) {
    __shared__ __align__(16) T hsm[2][kBC][kHStride];
    __shared__ __align__(16) unsigned char wsm[kGx > 0 ? kWxSlots * kBC * kWxRow : 16];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g8 = lane >> 2, c4 = lane & 3;
    const int n = blockIdx.x;
    const int b0 = blockIdx.y * kBC;
    const long long NHD = (long long)a.NH * kD;
    const int rev = kTimeline && rnncc::reversed(a, n);  // this head runs reversed

    // This thread's copies of W x: piece j of gate k of batch row r, from step 0 of the input.
    // Rows past the batch are zero-filled.
    const unsigned char* wsrc[kWxMine > 0 ? kWxMine : 1];
    unsigned wdst[kWxMine > 0 ? kWxMine : 1];
    bool wok[kWxMine > 0 ? kWxMine : 1], wmine[kWxMine > 0 ? kWxMine : 1];
    int wlen[kTimeline && kWxMine > 0 ? kWxMine : 1];  // the copies' row lengths (kTimeline)
#pragma unroll
    for (int i = 0; i < kWxMine; ++i) {
      const int c = threadIdx.x + i * kMmaThreads, r = c / (kGx * kWxPieces), k = c / kWxPieces % kGx, j = c % kWxPieces;
      wmine[i] = c < kBC * kGx * kWxPieces;
      wok[i] = wmine[i] && b0 + r < a.B;
      if constexpr (kTimeline) wlen[i] = rnncc::row_length(a.lengths, a.T, b0 + r, wok[i]);
      const long long row = wok[i] ? b0 + r : 0;
      wsrc[i] = static_cast<const unsigned char*>(a.Wx) + ((row * a.T * kGx + k) * NHD + (long long)n * kD) * 2 + j * kWxChunk;
      wdst[i] = (unsigned)__cvta_generic_to_shared(wsm) + r * kWxRow + k * kD * 2 + j * kWxChunk;
    }
    // Step t's copies, as one group (empty past the sequence, so that every step closes one).
    auto copy_wx = [&](const int t) {
      if (kGx > 0 && t < a.T) {
        const unsigned slot = (unsigned)t % kWxSlots * (kBC * kWxRow);
#pragma unroll
        for (int i = 0; i < kWxMine; ++i) {
          if (!wmine[i]) continue;
          const long long off = (long long)(kTimeline ? rnncc::position(wlen[i], rev, t) : t) * kGx * NHD * 2;
          if constexpr (kWxChunk >= 4) {
            rnncc::cp_async<kWxChunk>(wdst[i] + slot, wsrc[i] + off, wok[i]);
          } else {  // an odd head dim: 2-byte pieces, which cp.async cannot copy, loaded and stored
            const unsigned short v = wok[i] ? *reinterpret_cast<const unsigned short*>(wsrc[i] + off) : 0;
            asm volatile("st.shared.u16 [%0], %1;" ::"r"(wdst[i] + slot), "h"(v) : "memory");
          }
        }
      }
      rnncc::cp_async_commit();
    };
#pragma unroll
    for (int t = 0; t < kWxAhead; ++t) copy_wx(t);
    const T* bias = static_cast<const T*>(a.bias) + (long long)n * kD;
    const T* states = static_cast<const T*>(a.states);
    const int d = 8 * warp + g8;  // this lane's unit; its batch rows are 2 c4 + q, q = 0, 1
    const bool unit = d < kD;

    // A fragments of R: tile p, k tile kt; row m < 8 is gate 2p, m >= 8 gate 2p + 1, of unit
    // 8 warp + m % 8; column kk is h's unit 16 kt + kk.
    uint32_t ra[kPairs][kKTiles][4];
#pragma unroll
    for (int p = 0; p < kPairs; ++p) {
#pragma unroll
      for (int kt = 0; kt < kKTiles; ++kt) {
        const T* R = static_cast<const T*>(a.R);
        const int k0 = 16 * kt + 2 * c4;
        ra[p][kt][0] = rnncc::pack2<T>(r_at(R, a.NH, n, 2 * p, d, k0), r_at(R, a.NH, n, 2 * p, d, k0 + 1));
        ra[p][kt][1] = rnncc::pack2<T>(r_at(R, a.NH, n, 2 * p + 1, d, k0), r_at(R, a.NH, n, 2 * p + 1, d, k0 + 1));
        ra[p][kt][2] = rnncc::pack2<T>(r_at(R, a.NH, n, 2 * p, d, k0 + 8), r_at(R, a.NH, n, 2 * p, d, k0 + 9));
        ra[p][kt][3] = rnncc::pack2<T>(r_at(R, a.NH, n, 2 * p + 1, d, k0 + 8), r_at(R, a.NH, n, 2 * p + 1, d, k0 + 9));
      }
    }
    // Padding units and masked batch rows of h stay zero for the whole sequence.
    for (int i = threadIdx.x; i < 2 * kBC * kHStride; i += kMmaThreads) (&hsm[0][0][0])[i] = rnncc::from_float<T>(0.0f);
    __syncthreads();

    float st[kS][2];
    float pv[kP > 0 ? kP : 1][2];
    float bv[kGb > 0 ? kGb : 1][2];
    int len[kTimeline ? 2 : 1];  // the lane's rows' lengths (kTimeline)
    // A lane's addresses, as pointers moved one step on per step rather than whole 64-bit
    // indices per access (the forward is short of instructions to hide latency with): y and
    // R·h of the step, the saved states after it. A masked element points at element 0 of
    // head n, which it may read but never writes.
    const long long NBD = (long long)a.NH * a.B * kD;  // one state of the saved history
    T* yp[2];
    float* hp[2];
    float* rp[2];
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int b = 2 * c4 + q, gb = b0 + b;
      const bool live = unit && gb < a.B;
      const int g = live ? gb : 0, u = live ? d : 0;
      if constexpr (kTimeline) len[q] = rnncc::row_length(a.lengths, a.T, gb, live);
      yp[q] = static_cast<T*>(a.y) + (long long)g * a.T * NHD + (long long)n * kD + u;
      hp[q] = a.hist ? a.hist + kS * NBD + ((long long)n * a.B + g) * kD + u : nullptr;  // after step 0
      rp[q] = a.rh ? a.rh + ((long long)n * a.B + g) * kRows + u : nullptr;
#pragma unroll
      for (int s = 0; s < kS; ++s) {
        st[s][q] = live ? rnncc::to_float(states[(((long long)s * a.B + gb) * a.NH + n) * kD + d]) : 0.0f;
        if (live && a.hist) a.hist[(((long long)s * a.NH + n) * a.B + gb) * kD + d] = st[s][q];
      }
#pragma unroll
      for (int k = 0; k < kGb; ++k) bv[k][q] = unit ? rnncc::to_float(bias[k * NHD + d]) : 0.0f;
#pragma unroll
      for (int p = 0; p < kP; ++p)
        pv[p][q] = unit ? rnncc::to_float(static_cast<const T*>(a.params)[((long long)p * a.NH + n) * kD + d]) : 0.0f;
      if (kGr > 0 && live) hsm[0][b][d] = rnncc::from_float<T>(st[kRec][q]);
    }
    rnncc::cp_async_wait<kWxAhead - 1>();  // step 0's W x
    __syncthreads();
    [[maybe_unused]] const long long yO = (long long)a.B * a.T * NHD;  // outputs' stride (one output: unused)

    // One step: the copies of step t + kWxAhead's W x go out (into the slot that step t - 1
    // read), then the lane reads this step's from shared memory, raw (bits_float), converted
    // to float where the cell reads it. Before the step's barrier, each thread waits for its
    // copies of step t + 1.
    typedef uint32_t WxRegs[kGx > 0 ? kGx : 1][2];
    const unsigned short* const wxs = reinterpret_cast<const unsigned short*>(wsm) + (unit ? d : 0);
    auto step = [&](const int t) {
      copy_wx(t + kWxAhead);
      WxRegs wxv;
      {
        const unsigned short* const w = wxs + (unsigned)t % kWxSlots * (kBC * kWxRow / 2);
#pragma unroll
        for (int q = 0; q < 2; ++q)
#pragma unroll
          for (int k = 0; k < kGx; ++k) wxv[k][q] = w[(2 * c4 + q) * (kWxRow / 2) + k * kD];
      }
      float acc[kPairs][4];
#pragma unroll
      for (int p = 0; p < kPairs; ++p)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[p][i] = 0.0f;
      if (kGr > 0) {
        const T* hb = &hsm[t & 1][g8][2 * c4];  // B fragments: batch row g8
#pragma unroll
        for (int kt = 0; kt < kKTiles; ++kt) {
          const uint32_t h0 = *reinterpret_cast<const uint32_t*>(hb + 16 * kt);
          const uint32_t h1 = *reinterpret_cast<const uint32_t*>(hb + 16 * kt + 8);
#pragma unroll
          for (int p = 0; p < kPairs; ++p) rnncc::mma16816<T>(acc[p], ra[p][kt], h0, h1);
        }
      }
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int b = 2 * c4 + q, gb = b0 + b;
        if (unit && gb < a.B) {
          if (a.rh) {
#pragma unroll
            for (int k = 0; k < kGr; ++k) rp[q][k * kD] = acc[k / 2][k % 2 * 2 + q];
          }
          float next[kS];
          C::forward(ForwardIn<T>{st, wxv, acc, bv, pv, q}, next);
          if constexpr (kTimeline) {
            const bool on = t < len[q];  // else a held step: states kept, outputs 0 (at position t)
            T* const y = yp[q] + (long long)(rnncc::position(len[q], rev, t) - t) * NHD;
#pragma unroll
            for (int s = 0; s < kS; ++s) {
              if (!on) next[s] = st[s][q];
              st[s][q] = next[s];
            }
#pragma unroll
            for (int o = 0; o < kO; ++o) y[o * yO] = rnncc::from_float<T>(on ? next[C::output_state(o)] : 0.0f);
          } else {
#pragma unroll
            for (int s = 0; s < kS; ++s) st[s][q] = next[s];
#pragma unroll
            for (int o = 0; o < kO; ++o) yp[q][o * yO] = rnncc::from_float<T>(next[C::output_state(o)]);
          }
          if (a.hist) {
#pragma unroll
            for (int s = 0; s < kS; ++s) hp[q][s * NBD] = next[s];
          }
          if (kGr > 0) hsm[(t + 1) & 1][b][d] = rnncc::from_float<T>(next[kRec]);
        }
      }
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        yp[q] += NHD;
        if (a.hist) hp[q] += kS * NBD;
        if (a.rh) rp[q] += (long long)a.NH * a.B * kRows;
      }
      rnncc::cp_async_wait<kWxAhead - 1>();  // step t + 1's W x (later steps' may be in flight)
      __syncthreads();
    };
#pragma unroll 2
    for (int t = 0; t < a.T; ++t) step(t);

#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int gb = b0 + 2 * c4 + q;
      if (unit && gb < a.B) {
#pragma unroll
        for (int s = 0; s < kS; ++s)
          static_cast<T*>(a.last)[(((long long)s * a.B + gb) * a.NH + n) * kD + d] = rnncc::from_float<T>(st[s][q]);
      }
    }
  }

  // The copies of one backward input (kParts parts x kBC rows of kLen bytes, kRow bytes apart in a
  // slot from kOff on) that this thread issues, piece j of row r of a part each, with their
  // addresses worked out once: a step adds its offset.
  // Where step t of a set of copies reads or writes, per copy i (piece j of row r of a part):
  // at the step, or (kTimed: W x, dy and dWx under kTimeline) at row b0 + r's position of it.
  template <int kMine, int kPieces, bool kTimed>
  struct CopyTimes {
    int len[kTimed && kMine > 0 ? kMine : 1];  // the copies' row lengths
    int rev;

    __device__ __forceinline__ void timeline(const rnncc_fused_bwd_args& a, const int n, const int b0,
                                             const bool (&ok)[kMine > 0 ? kMine : 1]) {
      rev = rnncc::reversed(a, n);
#pragma unroll
      for (int i = 0; i < kMine; ++i) {
        const int r = (threadIdx.x + i * kMmaThreads) / kPieces % kBC;
        len[i] = rnncc::row_length(a.lengths, a.T, b0 + r, ok[i]);
      }
    }
    __device__ __forceinline__ int at(const int i, const int t) const {
      if constexpr (kTimed) {
        return rnncc::position(len[i], rev, t);
      } else {
        return t;
      }
    }
  };

  // kTimed: the input is at a row's positions (W x, dy; kTimeline), not at the step.
  template <int kParts, int kLen, int kRow, int kOff, bool kTimed = false>
  struct InCopies : CopyTimes<(kParts * kBC * (kLen / kWxChunk) + kMmaThreads - 1) / kMmaThreads, kLen / kWxChunk, kTimed> {
    static constexpr int kPieces = kLen / kWxChunk;
    static constexpr int kMine = (kParts * kBC * kPieces + kMmaThreads - 1) / kMmaThreads;
    const unsigned char* src[kMine > 0 ? kMine : 1];
    unsigned dst[kMine > 0 ? kMine : 1];
    bool ok[kMine > 0 ? kMine : 1], mine[kMine > 0 ? kMine : 1];
    long long step;  // bytes between steps

    // p: row 0 of part 0 at step 0; rows past `rows` are zero-filled.
    template <typename E>
    __device__ __forceinline__ void init(const E* p, long long rows, long long part_stride, long long row_stride,
                                         long long step_stride, unsigned base) {
      step = step_stride;
#pragma unroll
      for (int i = 0; i < kMine; ++i) {
        const int c = threadIdx.x + i * kMmaThreads, part = c / (kBC * kPieces), r = c / kPieces % kBC, j = c % kPieces;
        mine[i] = c < kParts * kBC * kPieces;
        ok[i] = mine[i] && r < rows;
        src[i] = reinterpret_cast<const unsigned char*>(p) + (ok[i] ? part * part_stride + r * row_stride : 0) + j * kWxChunk;
        dst[i] = base + kOff + (part * kBC + r) * kRow + j * kWxChunk;
      }
    }

    __device__ __forceinline__ void copy(const int t, const unsigned slot) const {
#pragma unroll
      for (int i = 0; i < kMine; ++i) {
        if (!mine[i]) continue;
        const long long at = (long long)this->at(i, t) * step;
        if constexpr (kWxChunk >= 4) {
          rnncc::cp_async<kWxChunk>(dst[i] + slot, src[i] + at, ok[i]);
        } else {  // an odd head dim: 2-byte pieces, loaded and stored
          const unsigned short v = ok[i] ? *reinterpret_cast<const unsigned short*>(src[i] + at) : 0;
          asm volatile("st.shared.u16 [%0], %1;" ::"r"(dst[i] + slot), "h"(v) : "memory");
        }
      }
    }
  };

  // A lane's two adjacent units from a slot: floats, and 16-bit values raw as get2_raw returns them.
  static __device__ __forceinline__ void in_get2(const float* p, float& lo, float& hi) {
    if constexpr (kPaired) {
      const float2 v = *reinterpret_cast<const float2*>(p);
      lo = v.x;
      hi = v.y;
    } else {
      lo = p[0];
      hi = p[1];
    }
  }
  static __device__ __forceinline__ void in_get2_raw(const unsigned short* p, uint32_t (&w)[2]) {
    if constexpr (kPaired) {
      w[0] = *reinterpret_cast<const uint32_t*>(p);
      w[1] = 0u;
    } else {
      w[0] = p[0];
      w[1] = p[1];
    }
  }

  // The backward's outputs of a step go the other way, from shared memory, where the lanes put
  // them (a lane's two units of one batch row), to global memory in whole pieces of a row, so
  // that a warp's stores cover adjacent bytes: stored by the lanes, each store of a warp would
  // touch eight rows, and the dWx and dGr stores would take a large part of a step. The copies
  // of one output: kParts parts x kBC rows of kLen bytes, from kSrcRow bytes
  // apart in a buffer (a part kSrcPart bytes on), to rows of global memory, with their addresses
  // worked out once; a step adds its offset.
  // kTimed: the output is at a row's positions (dWx; kTimeline), not at the step.
  template <int kParts, int kLen, int kSrcRow, int kSrcPart, bool kTimed = false>
  struct OutCopies : CopyTimes<(kParts * kBC * (kLen / kWxChunk) + kMmaThreads - 1) / kMmaThreads, kLen / kWxChunk, kTimed> {
    static constexpr int kPieces = kLen / kWxChunk;
    static constexpr int kMine = (kParts * kBC * kPieces + kMmaThreads - 1) / kMmaThreads;
    using Piece = typename rnncc::Bytes<kWxChunk>::type;
    unsigned char* dst[kMine > 0 ? kMine : 1];
    unsigned src[kMine > 0 ? kMine : 1];  // offset in the buffer
    bool ok[kMine > 0 ? kMine : 1];
    long long step;  // bytes between steps

    // p: row 0 of part 0 at step 0; rows past `rows` are not stored.
    template <typename E>
    __device__ __forceinline__ void init(E* p, long long rows, long long part_stride, long long row_stride,
                                         long long step_stride) {
      step = step_stride;
#pragma unroll
      for (int i = 0; i < kMine; ++i) {
        const int c = threadIdx.x + i * kMmaThreads, part = c / (kBC * kPieces), r = c / kPieces % kBC, j = c % kPieces;
        ok[i] = c < kParts * kBC * kPieces && r < rows;
        dst[i] = reinterpret_cast<unsigned char*>(p) + (ok[i] ? part * part_stride + r * row_stride : 0) + j * kWxChunk;
        src[i] = ok[i] ? r * kSrcRow + part * kSrcPart + j * kWxChunk : 0;
      }
    }

    __device__ __forceinline__ void copy(const int t, const unsigned char* buf) const {
#pragma unroll
      for (int i = 0; i < kMine; ++i)
        if (ok[i])
          *reinterpret_cast<Piece*>(dst[i] + (long long)this->at(i, t) * step) =
              *reinterpret_cast<const Piece*>(buf + src[i]);
    }
  };

  // Backward: per step from the last, the backward cell (C::backward) on the lane's two elements
  // (batch row g, units 8w + 2c + q), the gate cotangents (and dWx) into shared memory, a block
  // barrier, then dh += dgᵀ·R on the tensor cores, and the step's dWx and dGr out to global
  // memory (OutCopies).
  template <typename T>
  static __device__ __forceinline__ void backward(const rnncc_fused_bwd_args& a) {
    __shared__ __align__(16) T dgs[2][kBC][kGStride];
    // dWx of a step, double-buffered: a batch row's gates as in the forward's W x ring (kWxRow).
    __shared__ __align__(16) unsigned char dws[2][kGx > 0 ? kBC * kWxRow : 16];
    // Biases and params in shared memory rather than registers: the backward's registers go
    // to R, the states' cotangents and the prefetched inputs.
    __shared__ float bsm[kGb > 0 ? kGb : 1][kKP];
    __shared__ float psm[kP > 0 ? kP : 1][kKP];
    extern __shared__ __align__(16) unsigned char ism[];  // the ring of step inputs
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g8 = lane >> 2, c4 = lane & 3;
    const int n = blockIdx.x;
    [[maybe_unused]] const int b = g8;  // this lane's batch row in the chunk (the cell may not read it)
    const int gb = blockIdx.y * kBC + g8;  // and in the batch
    const long long NHD = (long long)a.NH * kD;
    const T* bias = static_cast<const T*>(a.bias) + (long long)n * kD;

    // B fragments of R: k tile kt covers gate rows 16 kt + kk (gate (16 kt + kk) / kKP, unit
    // (16 kt + kk) % kKP), column j is the unit 8 warp + j that the row reads.
    uint32_t rb[kGTiles][2];
#pragma unroll
    for (int kt = 0; kt < kGTiles; ++kt) {
      const T* R = static_cast<const T*>(a.R);
      const int r0 = 16 * kt + 2 * c4, r1 = r0 + 8, in = 8 * warp + g8;
      rb[kt][0] = rnncc::pack2<T>(r_at(R, a.NH, n, r0 / kKP, r0 % kKP, in), r_at(R, a.NH, n, (r0 + 1) / kKP, (r0 + 1) % kKP, in));
      rb[kt][1] = rnncc::pack2<T>(r_at(R, a.NH, n, r1 / kKP, r1 % kKP, in), r_at(R, a.NH, n, (r1 + 1) / kKP, (r1 + 1) % kKP, in));
    }
    // Padding rows and masked batch rows of dg stay zero for the whole sequence.
    for (int i = threadIdx.x; i < 2 * kBC * kGStride; i += kMmaThreads) (&dgs[0][0][0])[i] = rnncc::from_float<T>(0.0f);
    for (int i = threadIdx.x; i < kKP; i += kMmaThreads) {
#pragma unroll
      for (int k = 0; k < kGb; ++k) bsm[k][i] = i < kD ? rnncc::to_float(bias[k * NHD + i]) : 0.0f;
#pragma unroll
      for (int p = 0; p < kP; ++p)
        psm[p][i] = i < kD ? rnncc::to_float(static_cast<const T*>(a.params)[((long long)p * a.NH + n) * kD + i]) : 0.0f;
    }
    float ds[kS][2];
    SumOverTime sums;
    const int len = kTimeline ? rnncc::row_length(a.lengths, a.T, gb, gb < a.B) : 0;  // the lane's row's
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int d = 8 * warp + 2 * c4 + q;
      const bool live = d < kD && gb < a.B;
#pragma unroll
      for (int s = 0; s < kS; ++s)
        ds[s][q] = live ? rnncc::to_float(static_cast<const T*>(a.dlast)[(((long long)s * a.B + gb) * a.NH + n) * kD + d]) : 0.0f;
    }
    __syncthreads();

    // This thread's copies of the step inputs, and step t's into slot t % kInSlots (one group
    // per call; empty before the first step; rows past the batch are zero-filled); and its
    // copies of the step's dWx and dGr (from dws and dgs) out to global memory.
    const long long NHDb = (long long)a.NH * kD;
    InCopies<kS, kD * 4, kInS, 0> cs;
    InCopies<kGr, kD * 4, kInR, kInOffR> cr;
    InCopies<kGx, kD * 2, kInX, kInOffX, kTimeline> cx;
    InCopies<kO, kD * 2, kInY, kInOffY, kTimeline> cy;
    OutCopies<kGx, kD * 2, kWxRow, kD * 2, kTimeline> ox;
    OutCopies<kGr, kD * 2, kGStride * 2, kKP * 2> og;
    {
      const int b0 = blockIdx.y * kBC;
      const long long B = a.B, TT = a.T;
      const unsigned base = (unsigned)__cvta_generic_to_shared(ism);
      cs.init(a.hist + (n * B + b0) * kD, B - b0, a.NH * B * kD * 4, kD * 4, kS * a.NH * B * kD * 4, base);
      cr.init(a.rh + (n * B + b0) * kRows, B - b0, kD * 4, kRows * 4, a.NH * B * kRows * 4, base);
      cx.init(static_cast<const T*>(a.Wx) + b0 * TT * kGx * NHDb + n * kD, B - b0, NHDb * 2, TT * kGx * NHDb * 2, kGx * NHDb * 2, base);
      cy.init(static_cast<const T*>(a.dy) + b0 * TT * NHDb + n * kD, B - b0, B * TT * NHDb * 2, TT * NHDb * 2, NHDb * 2, base);
      ox.init(static_cast<T*>(a.dWx) + b0 * TT * kGx * NHDb + n * kD, B - b0, NHDb * 2, TT * kGx * NHDb * 2, kGx * NHDb * 2);
      og.init(static_cast<T*>(a.dGr) + (n * TT * B + b0) * kRows, B - b0, kD * 2, kRows * 2, B * kRows * 2);
      if constexpr (kTimeline) {
        cx.timeline(a, n, b0, cx.ok);
        cy.timeline(a, n, b0, cy.ok);
        ox.timeline(a, n, b0, ox.ok);
      }
    }
    auto copy_inputs = [&](const int t) {
      if (t >= 0) {
        const unsigned slot = (unsigned)t % kInSlots * kInSlot;
        cs.copy(t, slot);
        cr.copy(t, slot);
        cx.copy(t, slot);
        cy.copy(t, slot);
      }
      rnncc::cp_async_commit();
    };
    // Step t's inputs of the lane (batch row g8, units d0 and d0 + 1), from its slot; a lane
    // past the head dim reads unit 0's (its results are never stored).
    typedef StepInputs<T> Inputs;
    auto read_inputs = [&](const int t, Inputs& in) {
      const int d0 = 8 * warp + 2 * c4 < kD ? 8 * warp + 2 * c4 : 0;
      const unsigned char* const slot = ism + (unsigned)t % kInSlots * kInSlot;
#pragma unroll
      for (int s = 0; s < kS; ++s) in_get2(reinterpret_cast<const float*>(slot + (s * kBC + g8) * kInS) + d0, in.s[s][0], in.s[s][1]);
#pragma unroll
      for (int k = 0; k < kGr; ++k)
        in_get2(reinterpret_cast<const float*>(slot + kInOffR + (k * kBC + g8) * kInR) + d0, in.rh[k][0], in.rh[k][1]);
#pragma unroll
      for (int k = 0; k < kGx; ++k) in_get2_raw(reinterpret_cast<const unsigned short*>(slot + kInOffX + (k * kBC + g8) * kInX) + d0, in.wx[k]);
#pragma unroll
      for (int o = 0; o < kO; ++o) in_get2_raw(reinterpret_cast<const unsigned short*>(slot + kInOffY + (o * kBC + g8) * kInY) + d0, in.dy[o]);
    };
#pragma unroll
    for (int i = 1; i <= kInAhead; ++i) copy_inputs(a.T - i);
    rnncc::cp_async_wait<kInAhead - 1>();  // the last step's inputs
    __syncthreads();
    auto step = [&](const int t) {
      copy_inputs(t - kInAhead);
      Inputs cur;
      read_inputs(t, cur);
      float nd[kS][2];
      StepResults o;  // the step's results per element, stored below
      // The cell runs on masked elements too (their inputs are element 0's, their results are
      // never stored), without a branch: the part of it that does not wait for ds (the gates'
      // activations, from inputs loaded two steps ago) can then be scheduled into the latency
      // of the previous step's product.
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int d = 8 * warp + 2 * c4 + q;
#pragma unroll
        for (int s = 0; s < kS; ++s) nd[s][q] = 0.0f;
        C::backward(BackwardIn<T, kKP>{cur, &bsm[0][d], &psm[0][d], ds, q}, BackwardOut{nd, o, q});
      }
      if (kTimeline && t >= len) hold(ds, nd, o);
      // Stores, in the storage type, into shared memory: dWx, and the gate cotangents (the next
      // product's operand, and what the host's dR GEMM reads); bias and param cotangents summed.
      const int d0 = 8 * warp + 2 * c4;
      if (d0 < kD && gb < a.B) {
        const bool hi = d0 + 1 < kD;
        T* const dw = reinterpret_cast<T*>(&dws[t & 1][b * kWxRow]);
#pragma unroll
        for (int k = 0; k < kGx; ++k)
          put2(dw + k * kD + d0, hi, rnncc::from_float<T>(o.wx[k][0]), rnncc::from_float<T>(o.wx[k][1]));
#pragma unroll
        for (int k = 0; k < kGr; ++k)
          put2(&dgs[t & 1][b][k * kKP + d0], hi, rnncc::from_float<T>(o.gr[k][0]), rnncc::from_float<T>(o.gr[k][1]));
        sums.add(o.gb, o.p);
      }
      rnncc::cp_async_wait<kInAhead - 1>();  // step t - 1's inputs (earlier steps' may be in flight)
      __syncthreads();
      float acc[kChains][4];
#pragma unroll
      for (int i = 0; i < kChains; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
      if (kGr > 0) {
        const T* gbuf = &dgs[t & 1][g8][2 * c4];  // A fragments: batch row g8 (rows 8-15: zero)
#pragma unroll
        for (int kt = 0; kt < kGTiles; ++kt) {
          const uint32_t ga[4] = {*reinterpret_cast<const uint32_t*>(gbuf + 16 * kt), 0u,
                                  *reinterpret_cast<const uint32_t*>(gbuf + 16 * kt + 8), 0u};
          rnncc::mma16816<T>(acc[kt % kChains], ga, rb[kt][0], rb[kt][1]);
        }
      }
      // The step's dWx and dGr out (the buffers are written again two steps on, after the
      // barrier of the step between).
      ox.copy(t, dws[t & 1]);
      og.copy(t, reinterpret_cast<const unsigned char*>(&dgs[t & 1][0][0]));
#pragma unroll
      for (int q = 0; q < 2; ++q) {
#pragma unroll
        for (int s = 0; s < kS; ++s) ds[s][q] = nd[s][q];
        if (kGr > 0) {
          float sum = 0.0f;
#pragma unroll
          for (int i = 0; i < kChains; ++i) sum += acc[i][q];
          ds[kRec][q] += sum;
        }
      }
    };

#pragma unroll 2
    for (int t = a.T - 1; t >= 0; --t) step(t);

#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int d = 8 * warp + 2 * c4 + q;
      if (d < kD && gb < a.B) {
#pragma unroll
        for (int s = 0; s < kS; ++s)
          static_cast<T*>(a.dstates)[(((long long)s * a.B + gb) * a.NH + n) * kD + d] = rnncc::from_float<T>(ds[s][q]);
      }
    }
    const int d0 = 8 * warp + 2 * c4;
    if (d0 < kD && gb < a.B) sums.store(a, n, gb, d0);
  }
};

template <class C, typename T>
__global__ void __launch_bounds__(C::kMmaThreads, 1) forward_kernel(const rnncc_fused_args a) {
  Kernels<C>::template forward<T>(a);
}

template <class C, typename T>
__global__ void __launch_bounds__(C::kMmaThreads, 1) backward_kernel(const rnncc_fused_bwd_args a) {
  Kernels<C>::template backward<T>(a);
}

// The launch the plan gives (rnncc.variants.block_mma): a block per (head, batch chunk) of
// C::kMmaThreads threads, smem bytes of dynamic shared memory; another launch is refused.
template <class C, typename Args>
bool planned(const Args& a, const rnncc_launch& l, const int smem) {
  return l.kernel == 0 && l.threads == C::kMmaThreads && l.smem == smem && l.grid_x == a.NH &&
         l.grid_y == (a.B + C::kBC - 1) / C::kBC && l.grid_z == 1;
}

// Launches the block backward, its ring of step inputs in dynamic shared memory, once the
// function's limit for it is raised on the device: static and dynamic shared memory together
// may pass the default 48 KiB even where the ring alone does not (sLSTM, head dim 24: 56 KiB).
// Raised once per device and kept; a device past the first 64 raises it every launch.
template <class C, typename T>
int launch_backward(const rnncc_fused_bwd_args& a, const dim3 grid, cudaStream_t stream) {
  static std::atomic<unsigned long long> raised{0};  // a bit per device
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  const unsigned long long bit = dev >= 0 && dev < 64 ? 1ull << dev : 0ull;
  if (err == cudaSuccess && (raised.load() & bit) == 0) {
    err = cudaFuncSetAttribute(backward_kernel<C, T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::kBwSmem);
    if (err == cudaSuccess) raised.fetch_or(bit);
  }
  if (err != cudaSuccess) return (int)err;
  backward_kernel<C, T><<<grid, C::kMmaThreads, C::kBwSmem, stream>>>(a);
  return (int)cudaGetLastError();
}

// The library's entry points (rnncc_abi.h: rnncc_fused_forward, rnncc_fused_backward): 16-bit
// storage only, the plan never launches another dtype here.
template <class C>
int forward(const rnncc_fused_args* a, const rnncc_launch* l, cudaStream_t stream) {
  if (a->D != C::kD) return (int)cudaErrorInvalidValue;
  if ((long long)a->NH * a->B == 0) return 0;
  if (!planned<C>(*a, *l, 0)) return (int)cudaErrorInvalidValue;
  const dim3 grid((unsigned)l->grid_x, (unsigned)l->grid_y);
  switch (a->dtype) {
    case RNNCC_F16: forward_kernel<C, __half><<<grid, C::kMmaThreads, 0, stream>>>(*a); break;
    case RNNCC_BF16: forward_kernel<C, __nv_bfloat16><<<grid, C::kMmaThreads, 0, stream>>>(*a); break;
    default: return (int)cudaErrorNotSupported;
  }
  return (int)cudaGetLastError();
}

template <class C>
int backward(const rnncc_fused_bwd_args* a, const rnncc_launch* l, cudaStream_t stream) {
  if (a->D != C::kD) return (int)cudaErrorInvalidValue;
  if ((long long)a->NH * a->B == 0) return 0;
  if (!planned<C>(*a, *l, (int)C::kBwSmem)) return (int)cudaErrorInvalidValue;
  const dim3 grid((unsigned)l->grid_x, (unsigned)l->grid_y);
  switch (a->dtype) {
    case RNNCC_F16: return launch_backward<C, __half>(*a, grid, stream);
    case RNNCC_BF16: return launch_backward<C, __nv_bfloat16>(*a, grid, stream);
    default: return (int)cudaErrorNotSupported;
  }
}

}  // namespace block_mma
}  // namespace rnncc
