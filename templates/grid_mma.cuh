// The grid_mma variant's kernels (bf16 / fp16; fp32 as 3xTF32 on narrow blocks, rnncc_mma.cuh),
// for heads whose R does not fit one SM, and grid_stream's (grid_stream.cuh): block (u, head,
// batch chunk) owns UW tiles of 8 units, [8 UW u, 8 UW u + 8 UW) (UW = 1: narrow blocks, 2:
// wide, 4: streaming), and the chunk's NT x 8 batch rows, and keeps its part of R as mma
// fragments for the whole sequence, the product's k (h's units forward, the gate rows
// backward) split over the block's warps: in registers, or past what they hold (the plan says
// how many k tiles) in shared memory, and on streaming blocks the rest in global memory, read
// every step. A cell warp owns one unit tile (ut) of 8 batch rows
// (jt). A step:
//
// - forward: h of the step before, from every block of the head, through the exchange buffer
//   (rnncc_mma.cuh: values behind a counter per batch chunk, h in fragment order),
//   each warp loading its k range's B fragments itself; each warp's part of R·h (the A tiles
//   as in the block tier: two gates of a unit tile per tile) into shared memory; the cell
//   warps sum the parts, run the cell, C::forward (a lane: unit 8 (UW u + ut) + g, rows
//   8 jt + 2c and + 1) and publish the new h;
// - backward: the cell warps run the backward cell, C::backward (a lane: rows 8 jt + g, units
//   8 (UW u + ut) + 2c and + 1) and publish the gate cotangents (in fragment order); each warp
//   loads its k range's fragments of dg from the exchange rows; each warp's part of dgᵀ·R
//   (narrow: m = batch rows, 16 per tile, n = the 8 units; wide: m = the 16 units, n = 8 batch
//   rows per tile); the cell warps sum the parts into the states' cotangents.
//
// Blocks of one head wait only for the values they read (the rows of their chunk), with no
// grid-wide barrier. Every block of a launch must be resident at once: the launch is
// cooperative, and the host side splits (head, chunk) pairs into as many launches as the GPU
// needs (launch_grid, which also picks narrow or wide blocks and NT).
//
// Inputs are prefetched into L2 kL2Ahead steps before a register load of them.
//
// Templated on the generated cell struct C: the cell's shape, kD, kBC (8), and the plan's
// kernel table (kGridKernels kernels: kGridNT, kGridUW, their threads and shared memory), the
// product splits (kFwWarps, kFwKT, kBwWarps, kBwKT), the exchange's kXWords and kTimeline
// (per-row lengths and the reverse direction, rnncc_abi.h: a row's W x, y and their
// cotangents at its positions, held steps past its length; the forward's L2 prefetch of W x
// follows each row's positions, backwards in a reversed head (L2TimelineStream), the
// backward's of W x and dy only where a reversed head's rows are whole).
#pragma once
#include <type_traits>
#include <utility>

#include "cooperative.cuh"
#include "mma_common.cuh"
#include "step_trace.cuh"
#include "timeline.cuh"

namespace rnncc {
namespace grid_mma {

template <class C>
struct Kernels : MmaCommon<C> {
  using Base = MmaCommon<C>;
  using Base::kS, Base::kO, Base::kGx, Base::kGr, Base::kGb, Base::kP, Base::kRec, Base::kD, Base::kBC, Base::kRows;
  using Base::kKP, Base::kKTiles, Base::kPairs, Base::kGRows, Base::kGTiles, Base::kPaired;
  using Base::r_at, Base::get2, Base::put2, Base::bits_float, Base::get2_raw, Base::raw_float, Base::load_step_inputs;
  using Base::hold;
  using typename Base::SumOverTime, typename Base::StepResults, typename Base::BackwardOut;
  template <typename T>
  using StepInputs = typename Base::template StepInputs<T>;
  template <typename T>
  using ForwardIn = typename Base::template ForwardIn<T>;
  template <typename T, int kLen>
  using BackwardIn = typename Base::template BackwardIn<T, kLen>;
  static constexpr int kXWords = C::kXWords, kGridKernels = C::kGridKernels;
  static constexpr bool kTimeline = C::kTimeline;

  static constexpr int kL2Ahead = 8;

  // The plan (traits) sizes each kernel: kGridKernels of them, kernel i with blocks of kGridUW[i]
  // tiles of 8 units (1: narrow, 2: wide, 4: streaming) and kGridNT[i] tiles of 8 batch rows, kGridFwThreads[i]
  // and kGridBwThreads[i] threads, kGridFwSmem[i] and kGridBwSmem[i] bytes of dynamic shared
  // memory; the product's k split over kFwWarps[w] warps of kFwKT[w] k tiles (R·h) and
  // kBwWarps[w] of kBwKT[w] (dgᵀ·R), w = width(UW); kXWords exchange values per (head, batch row): dg
  // in fragment order, whole pairs of k tiles (rnncc::frag_pos; h fits in them, in the same order).
  // The traits' arrays over block widths: narrow (UW 1), wide (2), streaming (4).
  __host__ __device__ static constexpr int width(int uw) { return uw == 4 ? 2 : uw - 1; }
  __host__ __device__ static constexpr int grid_kernel_index(int nt, int uw) {
    for (int i = 0; i < kGridKernels; ++i)
      if (C::kGridNT[i] == nt && C::kGridUW[i] == uw) return i;
    return -1;
  }
  // The forward joins a warp's loads of h (rnncc::join) from this many k tiles (4 loads a lane),
  // on wide, split and streaming blocks (UW >= 2): with fewer, ptxas issues them together
  // anyway, and the join only delays the first mma. Not on narrow blocks, where it made the
  // forward slower (benchmarks/results/narrow-join-ab-h100-2026-11-27.txt).
  static constexpr int kJoinKT = 8;
  static constexpr int kUnitTiles = (kD + 7) / 8;  // tiles of 8 units per head
  static_assert(kXWords % 32 == 0 && kXWords >= kGTiles * 16, "the exchange holds a row's dg in whole k-tile pairs");
  static_assert(kBC == 8, "a block's batch rows are n tiles of 8");

  // Where (batch row r of the head, fragment-order position p) sits in an exchange slot: in
  // blocks of 8 rows x one pair of k tiles (32 values), so that a warp's 16-byte fragment loads
  // of one pair for 8 rows (lanes g, c: row g, values 8c..8c+7) read 512 adjacent bytes. Rows
  // past the batch are padding (a slot holds the batch rounded up to 8 rows per head).
  static __device__ __forceinline__ long long xchg_at(int r, int p) {
    return ((long long)(r >> 3) * (kXWords / 32) + (p >> 5)) * 256 + (r & 7) * 32 + (p & 31);
  }

  // The exchange of a block's head and batch chunk in a.xchg (rnncc_abi.h; the host sizes it in
  // attach_exchange): values [2][NH][B8 x kXWords] (Operand<T>::Bits, 16 or 32 bits; B8: B
  // rounded up to 8 rows), slot s
  // (by step parity) at slot(s), a value at + xchg_at(row, position); then the counters
  // [NH][B8 / 8], one per 8-row group. The first counter of the 8-row groups that step together
  // counts their slices' steps: each cell warp (of a unit tile inside the head) adds 1 per step,
  // so a step's count is kUnitTiles x the cell warps of a unit tile's 8 rows (per_tile) x the live
  // 8-row groups among them (per_step).
  template <typename T>
  struct Exchange {
    typedef typename rnncc::Operand<T>::Bits Bits;
    typedef typename rnncc::Operand<T>::Quad Quad;
    static constexpr int kHalves = sizeof(Bits) / 2;  // a value's 16-bit halves
    Bits* values;            // slot 0 of this head
    long long slot_size;     // values of one slot, every head
    unsigned* counter;       // the chunk's first 8-row group's
    int groups;              // the chunk's live 8-row groups
    unsigned per_tile;       // counts per unit tile and 8-row group each step (its cell warps)

    __device__ Exchange(unsigned* xchg, const int B, const int NH, const int n, const int b0, const int rows,
                        const unsigned per_tile = 1)
        : per_tile(per_tile) {
      const long long B8 = (B + 7) / 8 * 8;
      values = reinterpret_cast<Bits*>(xchg) + n * B8 * kXWords;
      slot_size = NH * B8 * kXWords;
      counter = xchg + kHalves * slot_size + (long long)n * (B8 / 8) + b0 / 8;  // past both slots (32-bit words)
      groups = (rows + 7) / 8;
    }
    __device__ __forceinline__ Bits* slot(const int s) const { return values + (s & 1) * slot_size; }
    // The part of R streamed from memory (rnncc_abi.h: past the counters, 16-byte aligned).
    static __device__ __forceinline__ Quad* stream(unsigned* xchg, const int B, const int NH) {
      const long long B8 = (B + 7) / 8 * 8, words = kHalves * NH * B8 * kXWords + NH * (B8 / 8);
      return reinterpret_cast<Quad*>(xchg + (words + 3) / 4 * 4);
    }
    // A step's count on the counter of the chunk's 8-row groups [first, first + count).
    __device__ __forceinline__ unsigned per_step(const int first, const int count) const {
      const int live = groups - first < count ? groups - first : count;
      return (unsigned)kUnitTiles * per_tile * (unsigned)(live > 0 ? live : 0);
    }
  };

  template <typename T, int NT, int UW>
  static __device__ __forceinline__ void forward(const rnncc_fused_args& a, const int n0, const int c0) {
    constexpr int kThreads = C::kGridFwThreads[grid_kernel_index(NT, UW)];
    constexpr int W = width(UW);
    constexpr int kWarps = C::kFwWarps[W], kKT = C::kFwKT[W];  // product warps, k tiles of R·h each
    constexpr int kMT = UW * kPairs;  // m tiles of R·h: the gate pairs of each unit tile
    // A warp's first kRKT k tiles of R in registers, the next kSKT in shared memory (fst: one
    // A fragment per lane, [warp][k tile][m tile][lane]) and the other kGKT in global memory
    // (gst, the same order per block, Exchange::stream), read each step: heads past what the
    // registers hold (the plan sizes them all, kFwStore bytes of shared memory before red).
    typedef typename rnncc::Operand<T>::Reg Reg;
    typedef typename rnncc::Operand<T>::Quad Quad;
    constexpr int kRKT = C::kFwRegKT[W], kSKT = C::kFwSmemKT[W], kGKT = kKT - kRKT - kSKT;
    static_assert(kRKT >= 0 && kSKT >= 0 && kGKT >= 0 && kWarps * kSKT * kMT * 32 * sizeof(Quad) <= C::kFwStore[W],
                  "a warp's k tiles are in registers, the plan's fragment store or global memory");
    extern __shared__ __align__(16) unsigned char smem[];
    Quad* const fst = reinterpret_cast<Quad*>(smem);
    // The chunk's n tiles in kSplit parts, each a recurrence of its own (its own counter): while
    // one part's h crosses the exchange, the block runs the other's product and cell. Each part
    // costs a wait of its own, so this pays only where the product is long: two parts of a
    // narrow block's 8 n tiles (fewer n tiles, or more parts, lose more to the waits).
    constexpr int kSplit = NT == 8 && UW == 1 ? 2 : 1, kNTh = NT / kSplit;
    // Streaming blocks of several n tiles read each streamed fragment of R once a step for kJS
    // n tiles (kStreamOnce): the n tiles' products run over the k tiles on chip (kPKT) one n
    // tile at a time, then over the streamed ones kJS n tiles at a time, kSG tiles' h
    // fragments loaded at once, so that the stream is read once a step for them. One n tile
    // keeps the unrolled product over all k tiles: this loop was slower there.
    constexpr bool kStreamOnce = kGKT > 0 && kNTh >= 2;
    constexpr int kPKT = kStreamOnce ? kRKT + kSKT : kKT, kJS = 2, kSG = 4;
    static_assert(!kStreamOnce || (kPKT > 0 && kNTh % kJS == 0), "n tiles in pairs, a k tile on chip");
    // n tiles whose h fragments are loaded at once: two, so that the second n tile's loads do not
    // wait behind the first's product; one in fp32, and on wide blocks whose warps take kJoinKT
    // k tiles or more, or which have more than two n tiles (their registers do not hold two n
    // tiles' fragments beside the rest).
    constexpr int kJ = kNTh < 2 || sizeof(T) == 4 || (UW >= 2 && (kPKT >= kJoinKT || kNTh > 2)) ? 1 : 2;
    // A cell lane's batch rows: 8 jt + 2 c4 + q + qs for q < kQ. Where a narrow block has twice as
    // many warps as n tiles, two cell warps share an n tile, one per row parity qs (kQ = 1): each
    // lane sums and runs the cell for one row rather than two, which shortens a narrow block's
    // step. Not on wide blocks: there it gains nothing or loses, and their 168 registers per
    // thread do not hold it.
    constexpr int kQ = UW == 1 && 2 * NT <= kWarps ? 1 : 2;
    constexpr int kRowWarps = 2 / kQ;  // cell warps per (unit tile, n tile), one per row parity
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g8 = lane >> 2, c4 = lane & 3;
    // a cell warp's unit tile, n tile (8 batch rows) and row parity
    const int ut = warp % UW, jt = warp / UW % NT, qs = kQ == 2 ? 0 : warp / (UW * NT);
    const int u = blockIdx.x, n = n0 + blockIdx.y, b0 = (c0 + blockIdx.z) * 8 * NT;
    const int rows = a.B - b0 < 8 * NT ? a.B - b0 : 8 * NT;  // live batch rows of this block
    const long long NHD = (long long)a.NH * kD;
    const T* bias = static_cast<const T*>(a.bias) + (long long)n * kD;
    const T* states = static_cast<const T*>(a.states);
    const int d = 8 * (UW * u + ut) + g8;  // a cell lane's unit
    const int r0 = 8 * jt + 2 * c4 + qs;  // and its first batch row in the chunk (then + q)
    const bool unit = d < kD, cell = warp < UW * NT * kRowWarps;
    const bool counts = cell && 8 * (UW * u + ut) < kD;  // a cell warp of a unit tile inside the head
    const Exchange<T> ex(a.xchg, a.B, a.NH, n, b0, rows, kRowWarps);
    // The warps' parts of R·h, [warp][m tile][n tile][row parity][lane], a cell lane's values
    // together: the C fragment's 4 (float4, kQ = 2) or its 2 of a row parity (float2 c0, c2 and
    // c1, c3, kQ = 1); summed over the warps kRedChunk parts at a time (rnncc::sum_parts).
    typedef typename std::conditional<kQ == 2, float4, float2>::type Part;
    Part* const red = reinterpret_cast<Part*>(smem + C::kFwStore[W]);
    constexpr int kRedChunk = kWarps < 6 ? kWarps : 6;

    // A fragments of R, k tiles [kKT warp, kKT warp + kKT) (zero past the head); m tile m: gates
    // 2p, 2p + 1 (p = m % kPairs) of unit tile m / kPairs. A lane reads back only what it stored.
    Reg ra[kMT][kRKT > 0 ? kRKT : 1][4];
    Quad* const gst = kGKT > 0 ? Exchange<T>::stream(a.xchg, a.B, a.NH) +
                                     (((long long)n * gridDim.x + u) * kWarps + warp) * kGKT * kMT * 32 + lane
                               : nullptr;
    auto stored = [&](const int i, const int m) -> Quad {
      if (i < kRKT + kSKT) return fst[((warp * kSKT + i - kRKT) * kMT + m) * 32 + lane];
      return rnncc::ldcg(gst + ((i - kRKT - kSKT) * kMT + m) * 32);
    };
    auto store = [&](const int i, const int m, const Quad& v) {
      if (i < kRKT + kSKT)
        fst[((warp * kSKT + i - kRKT) * kMT + m) * 32 + lane] = v;
      else
        rnncc::stcg(gst + ((i - kRKT - kSKT) * kMT + m) * 32, v);
    };
    auto fill = [&](const int i) {
      const T* R = static_cast<const T*>(a.R);
      const int k0 = 16 * (kKT * warp + i) + 2 * c4;
#pragma unroll
      for (int m = 0; m < kMT; ++m) {
        const int p = m % kPairs, dr = 8 * (UW * u + m / kPairs) + g8;
        const Reg f[4] = {
            rnncc::pack2<T>(r_at(R, a.NH, n, 2 * p, dr, k0), r_at(R, a.NH, n, 2 * p, dr, k0 + 1)),
            rnncc::pack2<T>(r_at(R, a.NH, n, 2 * p + 1, dr, k0), r_at(R, a.NH, n, 2 * p + 1, dr, k0 + 1)),
            rnncc::pack2<T>(r_at(R, a.NH, n, 2 * p, dr, k0 + 8), r_at(R, a.NH, n, 2 * p, dr, k0 + 9)),
            rnncc::pack2<T>(r_at(R, a.NH, n, 2 * p + 1, dr, k0 + 8), r_at(R, a.NH, n, 2 * p + 1, dr, k0 + 9))};
        if (i < kRKT) {
#pragma unroll
          for (int r = 0; r < 4; ++r) ra[m][i < kRKT ? i : 0][r] = f[r];
        } else if (warp < kWarps) {
          store(i, m, rnncc::quad(f));
        }
      }
    };
    // The store's tiles in a loop: unrolled with the registers' ones, ptxas hoists their loads
    // and runs out of registers (as in the backward).
#pragma unroll
    for (int i = 0; i < kRKT; ++i) fill(i);
#pragma unroll 1
    for (int i = kRKT; i < kKT; ++i) fill(i);

    float st[kS][2];  // [q]: slot 1 unused where kQ = 1, as in bv, pv and W x
    float pv[kP > 0 ? kP : 1][2];
    float bv[kGb > 0 ? kGb : 1][2];
    // The lengths of the block's rows (kTimeline), in shared memory rather than registers: the
    // wide kernels have no registers to spare (kept in registers, or read from global memory
    // where used, they spill).
    __shared__ int lsm[kTimeline ? 8 * NT : 1];
    if constexpr (kTimeline) {  // (the full-length kernels take no barrier for it)
      const int r = threadIdx.x, gb = b0 + r;
      if (r < 8 * NT) lsm[r] = rnncc::row_length(a.lengths, a.T, gb, gb < a.B);
      __syncthreads();
    }
    auto len = [&](const int q) { return lsm[r0 + q]; };
#pragma unroll
    for (int q = 0; q < kQ; ++q) {
      const int gb = b0 + r0 + q;
      const bool live = cell && unit && gb < a.B;
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
      if (kGr > 0 && live) rnncc::xchg_put(ex.slot(0) + xchg_at(gb, rnncc::frag_pos(d)), rnncc::from_float<T>(st[kRec][q]));
    }
    __syncwarp();
    if (kGr > 0 && counts && lane == 0 && b0 + 8 * jt < a.B) rnncc::xchg_count(ex.counter + jt / kNTh * kNTh);
    [[maybe_unused]] const long long yO = (long long)a.B * a.T * NHD;  // outputs' stride (one output: unused)
    const long long NBD = (long long)a.NH * a.B * kD;  // one state of the saved history
    T* const Y = static_cast<T*>(a.y);

    // W x of step t into w (cell lanes; unconditional loads, as in the block tier). Offsets are
    // computed where used rather than kept: the wide kernels have no registers to spare.
    typedef uint32_t WxRegs[kGx > 0 ? kGx : 1][2];  // raw elements (bits_float)
    auto load_wx = [&](const int t, WxRegs& w) {
      if (!cell) return;
      const int tc = t < a.T ? t : a.T - 1;
#pragma unroll
      for (int q = 0; q < kQ; ++q) {
        const int gb = b0 + r0 + q;
        const bool live = unit && gb < a.B;
        const long long step_off = (long long)(kTimeline ? rnncc::read_position(len(q), rnncc::reversed(a, n), tc) : tc) * kGx * NHD;
        const long long at = (long long)gb * a.T * kGx * NHD + (long long)n * kD + d + step_off;
        const auto* Wx = static_cast<const typename rnncc::Operand<T>::Bits*>(a.Wx) + (live ? at : 0);
#pragma unroll
        for (int k = 0; k < kGx; ++k) w[k][q] = Wx[k * NHD];
      }
    };
    const int units = kD - 8 * UW * u < 8 * UW ? kD - 8 * UW * u : 8 * UW;
    // W x, kL2Ahead steps ahead (over a timeline: each row's own positions, in either direction)
    constexpr int kWxLines = rnncc::l2_lines_per_thread(8 * NT * kGx, 8 * UW * (int)sizeof(T), kThreads);
    std::conditional_t<kTimeline, rnncc::L2TimelineStream<kWxLines>, rnncc::L2Stream<kWxLines>> wx_l2;
    if constexpr (kTimeline)
      wx_l2.init(static_cast<const T*>(a.Wx) + (long long)b0 * a.T * kGx * NHD + (long long)n * kD + 8 * UW * u,
                 (long long)a.T * kGx * NHD, rows, NHD, kGx, units, threadIdx.x, kThreads, (long long)kGx * NHD,
                 rnncc::reversed(a, n), a.T, [&](const int r) { return lsm[r]; });
    else
      wx_l2.init(static_cast<const T*>(a.Wx) + ((long long)b0 * a.T + kL2Ahead) * kGx * NHD + (long long)n * kD + 8 * UW * u,
                 (long long)a.T * kGx * NHD, rows, NHD, kGx, units, threadIdx.x, kThreads);
    RNNCC_TRACE_INIT
    auto step = [&](const int t, WxRegs& wxv) {
      RNNCC_TRACE(0)
      if (t + kL2Ahead < a.T) {
        if constexpr (kTimeline)
          wx_l2.prefetch(t + kL2Ahead, (rnncc::reversed(a, n) ? -1LL : 1LL) * kGx * NHD * (long long)sizeof(T));
        else
          wx_l2.prefetch((long long)t * kGx * NHD * (long long)sizeof(T));
      }
      for (int hf = 0; hf < kSplit; ++hf) {
        if (b0 + 8 * kNTh * hf >= a.B) break;  // a part wholly past the batch (uniform in the block)
        if (kGr > 0) {
          // Each product warp loads its B fragments straight from the exchange rows (published in
          // fragment order), kJ n tiles' loads in flight at once: no copy of h into shared
          // memory and no barrier before the product.
          rnncc::xchg_wait(ex.counter + kNTh * hf, (unsigned)(t + 1) * ex.per_step(kNTh * hf, kNTh));
          RNNCC_TRACE(1)
          if (warp < kWarps) {
            const auto* const hx = ex.slot(t);
#pragma unroll 1  // unrolled, ptxas hoists later tiles' loads and spills at NT = 8
            for (int j0 = kNTh * hf; j0 < kNTh * hf + kNTh; j0 += kJ) {
              Reg hb[kJ][kPKT][2];
#pragma unroll
              for (int j = 0; j < kJ; ++j)
                rnncc::load_fragments<kPKT, kKTiles, 256>(hx + xchg_at(b0 + 8 * (j0 + j) + g8, 0), kKT * warp, c4,
                                                         b0 + 8 * (j0 + j) + g8 < a.B, hb[j]);
              // Every load issued before the first mma: the warp barrier keeps ptxas from sinking a
              // later k tile's load below the mmas of an earlier one (into its registers), a second
              // L2 round trip in every step (benchmarks/results/grid-loads-first-h100-2026-11-27.txt).
              __syncwarp();
              if constexpr (kPKT >= kJoinKT && UW >= 2) {  // every n tile's first mma waits for all of the loads (rnncc::join)
                uint32_t all = 0u;
#pragma unroll
                for (int j = 0; j < kJ; ++j) all |= rnncc::or_all(hb[j]);
#pragma unroll
                for (int j = 0; j < kJ; ++j) rnncc::join(hb[j][0][0], all, rnncc::opaque_zero(a.B));
              }
#pragma unroll
              for (int j = 0; j < kJ; ++j) {  // n tile j0 + j: batch rows [8 (j0 + j), 8 (j0 + j) + 8) of the chunk
                float acc[kMT][4];
#pragma unroll
                for (int m = 0; m < kMT; ++m)
#pragma unroll
                  for (int i = 0; i < 4; ++i) acc[m][i] = 0.0f;
#pragma unroll
                for (int i = 0; i < kPKT; ++i) {
                  if (kKT * warp + i < kKTiles) {
#pragma unroll
                    for (int m = 0; m < kMT; ++m) {
                      if (i < kRKT) {
                        rnncc::mma16816<T>(acc[m], ra[m][i < kRKT ? i : 0], hb[j][i][0], hb[j][i][1]);
                      } else {
                        Reg f[4];
                        rnncc::unquad(stored(i, m), f);
                        rnncc::mma16816<T>(acc[m], f, hb[j][i][0], hb[j][i][1]);
                      }
                    }
                  }
                }
#pragma unroll
                for (int m = 0; m < kMT; ++m) {
                  Part* const r = red + ((warp * kMT + m) * NT + j0 + j) * 32 * kRowWarps + lane;
                  if constexpr (kQ == 2) {
                    r[0] = make_float4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]);
                  } else {
                    r[0] = make_float2(acc[m][0], acc[m][2]);
                    r[32] = make_float2(acc[m][1], acc[m][3]);
                  }
                }
              }
              if (j0 == kNTh * hf) { RNNCC_TRACE(2) }
            }
            RNNCC_TRACE(3)
            if constexpr (kStreamOnce) {  // the streamed k tiles, added to the parts above
#pragma unroll 1
              for (int j0 = kNTh * hf; j0 < kNTh * hf + kNTh; j0 += kJS) {
                float acc[kJS][kMT][4];
#pragma unroll
                for (int j = 0; j < kJS; ++j)
#pragma unroll
                  for (int m = 0; m < kMT; ++m)
#pragma unroll
                    for (int i = 0; i < 4; ++i) acc[j][m][i] = 0.0f;
#pragma unroll 1
                for (int g0 = 0; g0 < kGKT; g0 += kSG) {
                  Reg hb[kJS][kSG][2];
#pragma unroll
                  for (int j = 0; j < kJS; ++j)
                    rnncc::load_fragments<kSG, kKTiles, 256>(hx + xchg_at(b0 + 8 * (j0 + j) + g8, 0), kKT * warp + kPKT + g0,
                                                            c4, b0 + 8 * (j0 + j) + g8 < a.B, hb[j]);
#pragma unroll
                  for (int g = 0; g < kSG; ++g) {
                    if (g0 + g < kGKT && kKT * warp + kPKT + g0 + g < kKTiles) {
#pragma unroll
                      for (int m = 0; m < kMT; ++m) {
                        Reg f[4];
                        rnncc::unquad(rnncc::ldcg(gst + ((g0 + g) * kMT + m) * 32), f);
#pragma unroll
                        for (int j = 0; j < kJS; ++j) rnncc::mma16816<T>(acc[j][m], f, hb[j][g][0], hb[j][g][1]);
                      }
                    }
                  }
                }
#pragma unroll
                for (int j = 0; j < kJS; ++j)
#pragma unroll
                  for (int m = 0; m < kMT; ++m) {
                    Part* const r = red + ((warp * kMT + m) * NT + j0 + j) * 32 * kRowWarps + lane;
                    if constexpr (kQ == 2) {
                      const float4 o = r[0];
                      r[0] = make_float4(o.x + acc[j][m][0], o.y + acc[j][m][1], o.z + acc[j][m][2], o.w + acc[j][m][3]);
                    } else {
                      const float2 o0 = r[0], o1 = r[32];
                      r[0] = make_float2(o0.x + acc[j][m][0], o0.y + acc[j][m][2]);
                      r[32] = make_float2(o1.x + acc[j][m][1], o1.y + acc[j][m][3]);
                    }
                  }
              }
            }
          }
          __syncthreads();
          RNNCC_TRACE(4)
        }
        if (cell && jt / kNTh == hf) {
          // C fragment values (gate 2 p + k % 2, row r0 + q) at acc[p][k % 2 * 2 + q], q < kQ
          float acc[kPairs][4];
#pragma unroll
          for (int p = 0; p < kPairs; ++p) {
            constexpr int kStride = kMT * NT * 32 * kRowWarps;  // one warp's parts
            const Part* const r = red + ((ut * kPairs + p) * NT + jt) * 32 * kRowWarps + 32 * qs + lane;
            const Part sum = kGr > 0 ? rnncc::sum_parts<kWarps, kRedChunk>(r, kStride) : Part{};
            if constexpr (kQ == 2) {
              acc[p][0] = sum.x;
              acc[p][1] = sum.y;
              acc[p][2] = sum.z;
              acc[p][3] = sum.w;
            } else {
              acc[p][0] = sum.x;
              acc[p][2] = sum.y;
            }
          }
          RNNCC_TRACE(5)
          T* yp[2];
#pragma unroll
          for (int q = 0; q < kQ; ++q) {
            const int gb = b0 + r0 + q;
            const int p = kTimeline ? rnncc::position(len(q), rnncc::reversed(a, n), t) : t;
            yp[q] = Y + ((long long)gb * a.T + p) * NHD + (long long)n * kD + d;
          }
#pragma unroll
          for (int q = 0; q < kQ; ++q) {
            const int gb = b0 + r0 + q;
            if (unit && gb < a.B) {
              if (!kTimeline || t < len(q)) {  // else a held step: the states stay (outputs 0, below)
                float next[kS];
                C::forward(ForwardIn<T>{st, wxv, acc, bv, pv, q}, next);
                // the new states into registers
#pragma unroll
                for (int s = 0; s < kS; ++s) st[s][q] = next[s];
              }
              if (kGr > 0) rnncc::xchg_put(ex.slot(t + 1) + xchg_at(gb, rnncc::frag_pos(d)), rnncc::from_float<T>(st[kRec][q]));
            }
          }
          RNNCC_TRACE(6)
          __syncwarp();
          if (kGr > 0 && counts && lane == 0 && b0 + 8 * jt < a.B)
            rnncc::xchg_count(ex.counter + kNTh * hf);
          RNNCC_TRACE(7)
          // The outputs and what the backward reads, after the count: its release waits for every
          // store the warp issued before it, and these are read only after the kernel.
#pragma unroll
          for (int q = 0; q < kQ; ++q) {
            const int gb = b0 + r0 + q;
            if (unit && gb < a.B) {
              if (a.rh) {
#pragma unroll
                for (int k = 0; k < kGr; ++k) a.rh[(((long long)t * a.NH + n) * a.B + gb) * kRows + k * kD + d] = acc[k / 2][k % 2 * 2 + q];
              }
              const bool on = !kTimeline || t < len(q);
#pragma unroll
              for (int o = 0; o < kO; ++o) yp[q][o * yO] = rnncc::from_float<T>(on ? st[C::output_state(o)][q] : 0.0f);
              if (a.hist) {
                float* const h = a.hist + (t + 1) * kS * NBD + ((long long)n * a.B + gb) * kD + d;
#pragma unroll
                for (int s = 0; s < kS; ++s) h[s * NBD] = st[s][q];
              }
            }
          }
        }
      }
      load_wx(t + 2, wxv);  // after the cell's last read of it: two steps ahead
      RNNCC_TRACE(8)
    };

    WxRegs wa, wb;
    if (a.T > 0) {  // an empty sequence has no W x to read; else every load is clamped into it
      load_wx(0, wa);
      load_wx(1, wb);
    }
    int t = 0;
    for (; t + 1 < a.T; t += 2) {
      step(t, wa);
      step(t + 1, wb);
    }
    if (t < a.T) step(t, wa);
    RNNCC_TRACE_PRINT("fw", NT, UW)

    if (cell) {
#pragma unroll
      for (int q = 0; q < kQ; ++q) {
        const int gb = b0 + r0 + q;
        if (unit && gb < a.B) {
#pragma unroll
          for (int s = 0; s < kS; ++s)
            static_cast<T*>(a.last)[(((long long)s * a.B + gb) * a.NH + n) * kD + d] = rnncc::from_float<T>(st[s][q]);
        }
      }
    }
  }

  template <typename T, int NT, int UW>
  static __device__ __forceinline__ void backward(const rnncc_fused_bwd_args& a, const int n0, const int c0) {
    constexpr int kThreads = C::kGridBwThreads[grid_kernel_index(NT, UW)];
    constexpr int W = width(UW);
    constexpr int kWarps = C::kBwWarps[W], kKT = C::kBwKT[W];  // product warps, gate-row k tiles each
    // Tiles of dgᵀ·R: narrow, m tiles of 16 batch rows; wide and streaming, n tiles of 8 (m: the
    // block's units, kFA tiles of 16).
    constexpr int kMT = UW >= 2 ? NT : (NT + 1) / 2;
    // tiles whose dg fragments are loaded at once, and k tiles (fp32, twice the registers: fewer)
    constexpr int kMJ = kMT < 2 ? kMT : sizeof(T) == 4 ? 1 : 2;
    constexpr int kGroup = sizeof(T) == 4 ? 2 : 8;
    constexpr int kUnits = 8 * UW;  // units per block
    constexpr int kFA = UW >= 2 ? UW / 2 : 1;  // fragments of R per k tile
    constexpr int kRedTile = UW >= 2 ? kFA * 16 * 8 : 4 * 32;  // floats of one warp's tile in red
    // A warp's first kRKT gate-row k tiles of R in registers, the next kSKT in shared memory
    // (fst: a lane's kF words of each fragment, [warp][k tile][fragment][lane]) and the other
    // kGKT in global memory (gst), as the forward's.
    constexpr int kF = UW >= 2 ? 4 : 2;
    typedef typename rnncc::Operand<T>::Reg Reg;
    typedef typename std::conditional<UW >= 2, typename rnncc::Operand<T>::Quad, typename rnncc::Operand<T>::Duo>::type Frag;
    constexpr int kRKT = C::kBwRegKT[W], kSKT = C::kBwSmemKT[W], kGKT = kKT - kRKT - kSKT;
    static_assert(kRKT >= 0 && kSKT >= 0 && kGKT >= 0 && kWarps * kSKT * kFA * 32 * sizeof(Frag) <= C::kBwStore[W],
                  "a warp's k tiles are in registers, the plan's fragment store or global memory");
    static_assert(kGKT == 0 || UW >= 2, "streamed fragments are A fragments");
    extern __shared__ __align__(16) unsigned char smem[];
    Frag* const fst = reinterpret_cast<Frag*>(smem);
    float* const red = reinterpret_cast<float*>(smem + C::kBwStore[W]);  // the warps' parts of dgᵀ·R
    float (*const bsm)[kUnits] = reinterpret_cast<float (*)[kUnits]>(red + kWarps * kMT * kRedTile);  // [kGb][kUnits]
    float (*const psm)[kUnits] = bsm + (kGb > 0 ? kGb : 1);  // [kP][kUnits]
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g8 = lane >> 2, c4 = lane & 3;
    const int ut = warp % UW, jt = warp / UW;  // a cell warp's unit tile and 8 batch rows
    const int u = blockIdx.x, n = n0 + blockIdx.y, b0 = (c0 + blockIdx.z) * 8 * NT;
    const int rows = a.B - b0 < 8 * NT ? a.B - b0 : 8 * NT;
    const int d_blk = kUnits * u;  // the block's first unit
    const int gb = b0 + 8 * jt + g8;  // a cell lane's batch row; its units are d0 + q
    const int d0 = d_blk + 8 * ut + 2 * c4;
    const bool cell = warp < UW * NT;
    const bool counts = cell && d_blk + 8 * ut < kD;  // a cell warp of a unit tile inside the head
    const long long NHD = (long long)a.NH * kD;
    const T* bias = static_cast<const T*>(a.bias) + (long long)n * kD;
    const Exchange<T> ex(a.xchg, a.B, a.NH, n, b0, rows);

    // R's fragments, gate-row k tiles [kKT warp, kKT warp + kKT): narrow, B fragments (column j:
    // unit d_blk + j); wide and streaming, A fragments of Rᵀ (fragment ua, row m: unit
    // d_blk + 16 ua + m).
    Reg rf[kRKT > 0 ? kRKT : 1][kFA][kF];
    typename rnncc::Operand<T>::Quad* const gst =
        kGKT > 0 ? Exchange<T>::stream(a.xchg, a.B, a.NH) + (((long long)n * gridDim.x + u) * kWarps + warp) * kGKT * kFA * 32 + lane
                 : nullptr;
    // the fragment of store tile i (past the registers' tiles)
    auto slot = [&](const int i, const int ua) { return ((i - kRKT) * kFA + ua) * 32; };
    // A warp's streamed tiles [g0, g1) into L2 by one bulk prefetch, a group (kGroup tiles)
    // ahead of their loads: before a step's wait the first group, then at each group of the
    // store's tiles the next, so that the product's loads, which wait behind its mmas, find
    // them in L2 rather than HBM. The forward has none: there the prefetches made it slower.
    constexpr int kStreamTile = kFA * 32 * (int)sizeof(typename rnncc::Operand<T>::Quad);
    constexpr int kStreamAhead = kGroup;
    auto stream_ahead = [&](int g0, const int g1) {
      g0 = g0 > 0 ? g0 : 0;
      const int e = g1 < kGKT ? g1 : kGKT;
      if (kGKT > 0 && lane == 0 && g0 < e) rnncc::prefetch_l2_bulk(gst - lane + g0 * kFA * 32, (unsigned)(e - g0) * kStreamTile);
    };
    // A k tile's loads of R wait for the tile before's first (chain: zero, which the compiler
    // cannot know), so that ptxas does not issue every tile's loads at once, past the registers
    // a thread has; the fill runs once.
    uint32_t chain = 0u;
    auto fill = [&](const int i) {
      const T* R = static_cast<const T*>(a.R) + chain;
      const int r0 = 16 * (kKT * warp + i) + 2 * c4, r1 = r0 + 8;
      auto rt = [&](const int r, const int d) {  // Rᵀ[d][r r + 1], packed
        return rnncc::pack2<T>(r_at(R, a.NH, n, r / kKP, r % kKP, d), r_at(R, a.NH, n, (r + 1) / kKP, (r + 1) % kKP, d));
      };
#pragma unroll
      for (int ua = 0; ua < kFA; ++ua) {
        const int in = d_blk + 16 * ua + g8;
        Reg f[kF];
        f[0] = rt(r0, in);
        if constexpr (UW >= 2) {
          f[1] = rt(r0, in + 8);
          f[2] = rt(r1, in);
          f[3] = rt(r1, in + 8);
        } else {
          f[1] = rt(r1, in);
        }
        chain = rnncc::any_bits(f[0]) & rnncc::opaque_zero(a.B);
        if (i < kRKT) {
#pragma unroll
          for (int r = 0; r < kF; ++r) rf[i < kRKT ? i : 0][ua][r] = f[r];
        } else if (warp < kWarps) {
          if constexpr (UW >= 2) {
            const Frag v = rnncc::quad(f);
            if (i < kRKT + kSKT)
              fst[warp * kSKT * kFA * 32 + slot(i, ua) + lane] = v;
            else
              rnncc::stcg(gst + slot(i - kSKT, ua), v);
          } else {
            fst[warp * kSKT * kFA * 32 + slot(i, ua) + lane] = rnncc::duo(f[0], f[1]);
          }
        }
      }
    };
#pragma unroll
    for (int i = 0; i < kRKT; ++i) fill(i);
#pragma unroll 1
    for (int i = kRKT; i < kKT; ++i) fill(i);
    // k tile i's fragment ua: from registers, shared memory or global memory (i from the loops
    // over the store's groups, regs false: never from registers, as i is not known at compile
    // time there).
    auto frag = [&](const int i, const int ua, Reg (&f)[kF], const bool regs) {
      if (regs && i < kRKT) {
#pragma unroll
        for (int r = 0; r < kF; ++r) f[r] = rf[i < kRKT ? i : 0][ua][r];
        return;
      }
      if constexpr (UW >= 2) {
        rnncc::unquad(i < kRKT + kSKT ? fst[warp * kSKT * kFA * 32 + slot(i, ua) + lane] : rnncc::ldcg(gst + slot(i - kSKT, ua)), f);
      } else {
        rnncc::unduo(fst[warp * kSKT * kFA * 32 + slot(i, ua) + lane], f[0], f[1]);
      }
    };
    if (threadIdx.x < kUnits) {
      const int du = d_blk + threadIdx.x;
#pragma unroll
      for (int k = 0; k < kGb; ++k) bsm[k][threadIdx.x] = du < kD ? rnncc::to_float(bias[k * NHD + du]) : 0.0f;
#pragma unroll
      for (int p = 0; p < kP; ++p)
        psm[p][threadIdx.x] = du < kD ? rnncc::to_float(static_cast<const T*>(a.params)[((long long)p * a.NH + n) * kD + du]) : 0.0f;
    }
    // The product over a warp's k tiles in groups of kGroup: unrolled while a group starts in
    // the registers' tiles, the store's groups in a loop (unrolled, ptxas hoists their loads
    // and runs out of registers at the widest blocks).
    auto groups = [&](const auto& group) {
#pragma unroll
      for (int i0 = 0; i0 < kRKT; i0 += kGroup) group(i0, true);
#pragma unroll 1
      for (int i0 = (kRKT + kGroup - 1) / kGroup * kGroup; i0 < kKT; i0 += kGroup) group(i0, false);
    };
    float ds[kS][2];
    SumOverTime sums;
    // the lane's row's length, negative in a reversed head (one register: rnncc::signed_length)
    const int len = kTimeline ? rnncc::signed_length(rnncc::row_length(a.lengths, a.T, gb, cell && gb < a.B), rnncc::reversed(a, n)) : 0;
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int d = d0 + q;
      const bool live = cell && d < kD && gb < a.B;
#pragma unroll
      for (int s = 0; s < kS; ++s)
        ds[s][q] = live ? rnncc::to_float(static_cast<const T*>(a.dlast)[(((long long)s * a.B + gb) * a.NH + n) * kD + d]) : 0.0f;
    }
    __syncthreads();

    typedef StepInputs<T> Inputs;
    const long long yO = (long long)a.B * a.T * NHD;
    auto load_inputs = [&](const int t, Inputs& in) {
      // a held step's W x and dy (past the row's length: unused) from element 0 (position -1),
      // in L2: a reversed row's positions past its length are not prefetched
      if (t >= 0 && cell) load_step_inputs(a, t, kTimeline ? (t < abs(len) ? rnncc::signed_position(len, t) : -1) : t, n, gb, d0, in);
    };
    const int units = kD - d_blk < kUnits ? kD - d_blk : kUnits;
    // Step t's inputs of this block's units into L2: the addresses of step 0, moved per step.
    const long long NB = (long long)a.NH * a.B;
    rnncc::L2Stream<rnncc::l2_lines_per_thread(kS * 8 * NT, 4 * kUnits, kThreads)> hist_l2;
    rnncc::L2Stream<rnncc::l2_lines_per_thread(8 * NT * (kGr > 0 ? kGr : 1), 4 * kUnits, kThreads)> rh_l2;
    rnncc::L2Stream<rnncc::l2_lines_per_thread(8 * NT * kGx, kUnits * (int)sizeof(T), kThreads)> wx_l2;
    rnncc::L2Stream<rnncc::l2_lines_per_thread(8 * NT * kO, kUnits * (int)sizeof(T), kThreads)> dy_l2;
    hist_l2.init(a.hist + (long long)n * a.B * kD + (long long)b0 * kD + d_blk, NB * kD, kS, kD, rows, units, threadIdx.x,
                 kThreads);
    if (kGr > 0)
      rh_l2.init(a.rh + ((long long)n * a.B + b0) * kRows + d_blk, kRows, rows, kD, kGr, units, threadIdx.x, kThreads);
    // W x and dy: a reversed head's rows run backwards from position T - 1 where every row is
    // whole (no lengths); with lengths a reversed head's are not prefetched (a row's own end
    // per address, as the forward's L2TimelineStream keeps, made this kernel slower).
    const bool rev = kTimeline && rnncc::reversed(a, n);
    const long long last = rev ? a.T - 1 : 0;
    wx_l2.init(static_cast<const T*>(a.Wx) + ((long long)b0 * a.T + last) * kGx * NHD + (long long)n * kD + d_blk,
               (long long)a.T * kGx * NHD, rows, NHD, kGx, units, threadIdx.x, kThreads);
    dy_l2.init(static_cast<const T*>(a.dy) + ((long long)b0 * a.T + last) * NHD + (long long)n * kD + d_blk,
               (long long)a.T * NHD, rows, yO, kO, units, threadIdx.x, kThreads);
    auto prefetch = [&](const int t) {
      hist_l2.prefetch((long long)t * kS * NB * kD * (long long)sizeof(float));
      if (kGr > 0) rh_l2.prefetch((long long)t * NB * kRows * (long long)sizeof(float));
      if (!(kTimeline && len < 0) || a.lengths == nullptr) {  // not a reversed head's rows of their own lengths
        const long long s = kTimeline && len < 0 ? -t : t;  // every lane's len is signed
        wx_l2.prefetch(s * kGx * NHD * (long long)sizeof(T));
        dy_l2.prefetch(s * NHD * (long long)sizeof(T));
      }
    };
    // One buffer: step t - 1's inputs are loaded once the cell of step t is done with step t's,
    // and arrive while the block waits for the other blocks' dg and runs the product.
    RNNCC_TRACE_INIT
    auto step = [&](const int t, Inputs& cur) {
      RNNCC_TRACE(0)
      if (t - kL2Ahead >= 0) prefetch(t - kL2Ahead);
      if (cell) {
        float nd[kS][2];
        StepResults o;
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int d = d0 + q;
#pragma unroll
          for (int s = 0; s < kS; ++s) nd[s][q] = 0.0f;
          if (d < kD && gb < a.B) {
            C::backward(BackwardIn<T, kUnits>{cur, &bsm[0][d - d_blk], &psm[0][d - d_blk], ds, q}, BackwardOut{nd, o, q});
          }
        }
        if (kTimeline && t >= abs(len)) hold(ds, nd, o);
        const int p = kTimeline ? rnncc::signed_position(len, t) : t;
        T* const dWx = static_cast<T*>(a.dWx) + (((long long)gb * a.T + p) * kGx) * NHD + (long long)n * kD;
        T* const dGr = static_cast<T*>(a.dGr) + (((long long)n * a.T + t) * a.B + gb) * kRows;
        const bool live = d0 < kD && gb < a.B, hi = d0 + 1 < kD;
        if (live) {
          auto* const xs = ex.slot(t);
#pragma unroll
          for (int k = 0; k < kGr; ++k) {
            const T lo_v = rnncc::from_float<T>(o.gr[k][0]), hi_v = rnncc::from_float<T>(o.gr[k][1]);
            if (hi)  // d0 even: its pair stays adjacent in fragment order
              rnncc::xchg_put2(xs + xchg_at(gb, rnncc::frag_pos(k * kKP + d0)), lo_v, hi_v);
            else
              rnncc::xchg_put(xs + xchg_at(gb, rnncc::frag_pos(k * kKP + d0)), lo_v);
          }
          sums.add(o.gb, o.p);
        }
        RNNCC_TRACE(1)
        __syncwarp();
        if (kGr > 0 && counts && lane == 0 && b0 + 8 * jt < a.B)
          rnncc::xchg_count(ex.counter);
        RNNCC_TRACE(2)
        // dWx and dGr after the count, as the forward's outputs: read only after the kernel.
        if (live) {
#pragma unroll
          for (int k = 0; k < kGx; ++k)
            put2(dWx + k * NHD + d0, hi, rnncc::from_float<T>(o.wx[k][0]), rnncc::from_float<T>(o.wx[k][1]));
#pragma unroll
          for (int k = 0; k < kGr; ++k)
            put2(dGr + k * kD + d0, hi, rnncc::from_float<T>(o.gr[k][0]), rnncc::from_float<T>(o.gr[k][1]));
        }
#pragma unroll
        for (int q = 0; q < 2; ++q)
#pragma unroll
          for (int s = 0; s < kS; ++s) ds[s][q] = nd[s][q];
      }
      RNNCC_TRACE(3)
      load_inputs(t - 1, cur);
      if (kGr > 0) {
        if (warp < kWarps) stream_ahead(0, kStreamAhead);
        rnncc::xchg_wait(ex.counter, (unsigned)(a.T - t) * ex.per_step(0, NT));
        RNNCC_TRACE(4)
        if constexpr (UW == 1) {
          if (warp < kWarps) {
            // A fragments straight from the exchange rows (dg published in fragment order, as h in
            // the forward): rows 16 m + g (a0, a2) and 16 m + 8 + g (a1, a3), kGroup k tiles'
            // loads in flight at once, in place of a copy of dg into shared memory (faster at
            // B = 16, slower for the LSTM at B = 64, for a reason not found).
            const auto* const dgx = ex.slot(t);
#pragma unroll 1  // as the forward's n tiles: unrolled, ptxas hoists later tiles' loads and spills
            for (int m0 = 0; m0 < kMT; m0 += kMJ) {  // m tiles m0 + j: batch rows [16 (m0 + j), + 16) of the chunk
              float acc[kMJ][4];
              bool lo_live[kMJ], hi_live[kMJ];
#pragma unroll
              for (int j = 0; j < kMJ; ++j) {
                const int m = m0 + j;
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
                lo_live[j] = m < kMT && b0 + 16 * m + g8 < a.B;
                hi_live[j] = m < kMT && 16 * m + 8 < NT * 8 && b0 + 16 * m + 8 + g8 < a.B;  // else rows 8-15 are zero
              }
              auto group = [&](const int i0, const bool regs) {
                constexpr int kN = kGroup;
                Reg lo[kMJ][kN][2], hi[kMJ][kN][2];
#pragma unroll
                for (int j = 0; j < kMJ; ++j) {
                  const int r = b0 + 16 * (m0 + j) + g8;
                  rnncc::load_fragments<kN, kGTiles, 256>(dgx + xchg_at(r, 0), kKT * warp + i0, c4, lo_live[j], lo[j]);
                  rnncc::load_fragments<kN, kGTiles, 256>(dgx + xchg_at(r + 8, 0), kKT * warp + i0, c4, hi_live[j], hi[j]);
                }
#pragma unroll
                for (int j = 0; j < kMJ; ++j)
#pragma unroll
                  for (int i = 0; i < kN; ++i) {
                    if (i0 + i < kKT && kKT * warp + i0 + i < kGTiles) {
                      const Reg ga[4] = {lo[j][i][0], hi[j][i][0], lo[j][i][1], hi[j][i][1]};
                      Reg f[kF];
                      frag(i0 + i, 0, f, regs);
                      rnncc::mma16816<T>(acc[j], ga, f[0], f[1]);
                    }
                  }
              };
              groups(group);
#pragma unroll
              for (int j = 0; j < kMJ; ++j)
                if (m0 + j < kMT) {
#pragma unroll
                  for (int i = 0; i < 4; ++i) red[((warp * kMT + m0 + j) * 4 + i) * 32 + lane] = acc[j][i];
                }
            }
          }
        }
        if constexpr (UW >= 2) {
          if (warp < kWarps) {
            // Wide: m = the block's units (Rᵀ's A fragments, kFA of 16), n = 8 batch rows (dg's B
            // fragments, the same registers as the narrow product's A fragments of one row).
            const auto* const dgx = ex.slot(t);
#pragma unroll 1  // as the narrow product's m tiles
            for (int m0 = 0; m0 < kMT; m0 += kMJ) {  // n tiles m0 + j: batch rows [8 (m0 + j), + 8) of the chunk
              float acc[kMJ][kFA][4];
              bool live[kMJ];
#pragma unroll
              for (int j = 0; j < kMJ; ++j) {
#pragma unroll
                for (int ua = 0; ua < kFA; ++ua)
#pragma unroll
                  for (int i = 0; i < 4; ++i) acc[j][ua][i] = 0.0f;
                live[j] = m0 + j < kMT && b0 + 8 * (m0 + j) + g8 < a.B;
              }
              auto group = [&](const int i0, const bool regs) {
                constexpr int kN = kGroup;
                if (!regs && m0 == 0) {
                  const int g = i0 - kRKT - kSKT + kStreamAhead;
                  stream_ahead(g > kStreamAhead ? g : kStreamAhead, g + kN);
                }
                Reg fb[kMJ][kN][2];
#pragma unroll
                for (int j = 0; j < kMJ; ++j)
                  rnncc::load_fragments<kN, kGTiles, 256>(dgx + xchg_at(b0 + 8 * (m0 + j) + g8, 0), kKT * warp + i0, c4, live[j], fb[j]);
                if (regs) {  // fragments in registers: n tile by n tile (the other order spills)
#pragma unroll
                  for (int j = 0; j < kMJ; ++j)
#pragma unroll
                    for (int i = 0; i < kN; ++i) {
                      if (i0 + i < kKT && kKT * warp + i0 + i < kGTiles) {
#pragma unroll
                        for (int ua = 0; ua < kFA; ++ua) {
                          Reg f[kF];
                          frag(i0 + i, ua, f, true);
                          rnncc::mma16816<T>(acc[j][ua], f, fb[j][i][0], fb[j][i][1]);
                        }
                      }
                    }
                } else {  // each loaded fragment (shared memory, or streamed) serves the kMJ n tiles
#pragma unroll
                  for (int i = 0; i < kN; ++i) {
                    if (i0 + i < kKT && kKT * warp + i0 + i < kGTiles) {
#pragma unroll
                      for (int ua = 0; ua < kFA; ++ua) {
                        Reg f[kF];
                        frag(i0 + i, ua, f, false);
#pragma unroll
                        for (int j = 0; j < kMJ; ++j) rnncc::mma16816<T>(acc[j][ua], f, fb[j][i][0], fb[j][i][1]);
                      }
                    }
                  }
                }
              };
              groups(group);
              // C rows g8 and g8 + 8 (units 16 ua + those), columns 2 c4, + 1 (batch rows):
              // red[warp][tile][unit][row].
#pragma unroll
              for (int j = 0; j < kMJ; ++j)
                if (m0 + j < kMT) {
#pragma unroll
                  for (int ua = 0; ua < kFA; ++ua) {
                    float* const r = red + ((warp * kMT + m0 + j) * 16 * kFA + 16 * ua + g8) * 8 + 2 * c4;
                    *reinterpret_cast<float2*>(r) = make_float2(acc[j][ua][0], acc[j][ua][1]);
                    *reinterpret_cast<float2*>(r + 64) = make_float2(acc[j][ua][2], acc[j][ua][3]);
                  }
                }
            }
          }
        }
        RNNCC_TRACE(5)
        __syncthreads();
        RNNCC_TRACE(6)
        if (cell) {
          // The warps' parts of the lane's two values, summed as the forward's (rnncc::sum_parts),
          // loaded together rather than as a running sum of dependent loads.
          constexpr int kRedChunk = kWarps < 6 ? kWarps : 6;
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const float* const r = UW >= 2 ? red + ((jt * 16 * kFA + 8 * ut + 2 * c4 + q) * 8 + g8)
                                           : red + (((warp / 2) * 4 + (warp % 2) * 2 + q) * 32 + lane);
            ds[kRec][q] += rnncc::sum_parts<kWarps, kRedChunk>(r, kMT * kRedTile);
          }
        }
      }
    };

    Inputs in;
    load_inputs(a.T - 1, in);
    for (int t = a.T - 1; t >= 0; --t) {
      step(t, in);
      RNNCC_TRACE(7)
    }
    RNNCC_TRACE_PRINT("bw", NT, UW)

    if (cell) {
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int d = d0 + q;
        if (d < kD && gb < a.B) {
#pragma unroll
          for (int s = 0; s < kS; ++s)
            static_cast<T*>(a.dstates)[(((long long)s * a.B + gb) * a.NH + n) * kD + d] = rnncc::from_float<T>(ds[s][q]);
        }
      }
      if (d0 < kD && gb < a.B) sums.store(a, n, gb, d0);
    }
  }
};

template <class C, typename T, int NT, int UW>
__global__ void __launch_bounds__(C::kGridFwThreads[Kernels<C>::grid_kernel_index(NT, UW)], 1)
    forward_kernel(const rnncc_fused_args a, const int n0, const int c0) {
  Kernels<C>::template forward<T, NT, UW>(a, n0, c0);
}

template <class C, typename T, int NT, int UW>
__global__ void __launch_bounds__(C::kGridBwThreads[Kernels<C>::grid_kernel_index(NT, UW)], 1)
    backward_kernel(const rnncc_fused_bwd_args a, const int n0, const int c0) {
  Kernels<C>::template backward<T, NT, UW>(a, n0, c0);
}

// The grid-tier kernels of one direction and storage type: the plan's table (traits) in its
// order, launched as the plan says (rnncc.variants.grid_mma picks the kernel and splits the
// (head, chunk) pairs over launches of at most one block per SM). Each launch is cooperative
// (rnncc::launch_cooperative): all its blocks are resident at once, or the launch fails.
template <typename Args>
struct GridKernel {
  void (*fn)(Args, int, int);
  int threads;
  size_t smem;
};

template <class C, typename T, bool Fw, int I>
constexpr auto grid_kernel() {
  using Args = typename std::conditional<Fw, rnncc_fused_args, rnncc_fused_bwd_args>::type;
  if constexpr (Fw)
    return GridKernel<Args>{forward_kernel<C, T, C::kGridNT[I], C::kGridUW[I]>, C::kGridFwThreads[I], C::kGridFwSmem[I]};
  else
    return GridKernel<Args>{backward_kernel<C, T, C::kGridNT[I], C::kGridUW[I]>, C::kGridBwThreads[I], C::kGridBwSmem[I]};
}

template <class C, typename T, bool Fw, typename Args, int... I>
int launch(const Args& a, const rnncc_launch& l, cudaStream_t stream, std::integer_sequence<int, I...>) {
  static const GridKernel<Args> ks[C::kGridKernels] = {grid_kernel<C, T, Fw, I>()...};
  static rnncc::SmemLimit limits[C::kGridKernels];
  if (l.kernel < 0 || l.kernel >= C::kGridKernels) return (int)cudaErrorInvalidValue;
  const GridKernel<Args>& k = ks[l.kernel];
  const int chunks = (a.B + 8 * C::kGridNT[l.kernel] - 1) / (8 * C::kGridNT[l.kernel]);
  const int unit_tiles = Kernels<C>::kUnitTiles;
  if (l.grid_x != (unit_tiles + C::kGridUW[l.kernel] - 1) / C::kGridUW[l.kernel]) return (int)cudaErrorInvalidValue;
  return rnncc::launch_cooperative(k.fn, a, l, k.threads, k.smem, chunks, limits[l.kernel], stream,
                                   Fw ? C::kFwL2Claim : C::kBwL2Claim);
}

// The library's entry points (rnncc_abi.h: rnncc_fused_forward, rnncc_fused_backward): fp32
// storage where the plan built the library for it (kFp32: its kernels' register budgets are
// fp32's), else bf16 and fp16; the exchange buffer the host attached must hold kXWords values
// per (head, batch row).
template <class C, bool Fw, typename Args>
int entry(const Args* a, const rnncc_launch* l, cudaStream_t stream) {
  if (a->D != C::kD) return (int)cudaErrorInvalidValue;
  if ((long long)a->NH * a->B == 0) return 0;
  if (C::kGr > 0 && (a->xchg == nullptr || a->xchg_words != C::kXWords)) return (int)cudaErrorInvalidValue;
  constexpr auto kernels = std::make_integer_sequence<int, C::kGridKernels>{};
  if constexpr (C::kFp32) {
    if (a->dtype == RNNCC_F32) return launch<C, float, Fw>(*a, *l, stream, kernels);
  } else {
    switch (a->dtype) {
      case RNNCC_F16: return launch<C, __half, Fw>(*a, *l, stream, kernels);
      case RNNCC_BF16: return launch<C, __nv_bfloat16, Fw>(*a, *l, stream, kernels);
      default: break;
    }
  }
  return (int)cudaErrorNotSupported;
}

template <class C>
int forward(const rnncc_fused_args* a, const rnncc_launch* l, cudaStream_t stream) {
  return entry<C, true>(a, l, stream);
}

template <class C>
int backward(const rnncc_fused_bwd_args* a, const rnncc_launch* l, cudaStream_t stream) {
  return entry<C, false>(a, l, stream);
}

}  // namespace grid_mma
}  // namespace rnncc
