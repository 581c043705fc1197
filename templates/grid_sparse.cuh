// The grid_sparse variant's kernels (bf16 / fp16): the grid tier for a sparse R (a mask whose
// dropped entries are zeros of R). Block (u, head, batch chunk) owns kU units [kU u, kU u + kU)
// and kNB batch rows, and keeps the non-zeros of its part of R on chip for the whole sequence
// as 32-bit entries: the value's 16 bits, then its column (16 bits). The forward's part is R's
// rows of its units (slots: gate k, unit: k kU + unit), the backward's R's columns of its units
// (slots: the units; a column index is a gate row k D + row, in chunks of one gate, kD columns,
// each chunk's operand staged in turn).
//
// The kernel's prologue finds the non-zeros itself (a warp per slot, ballots in column order,
// so their order is deterministic) into the block's scratch in the exchange buffer, cuts each
// chunk's slots into pieces of one slot each and deals them to the warps' rounds (32 pieces a
// round, a lane running one piece whole: `distribute`), and moves them where the steps read
// them: a warp's first kFwRegSteps / kBwRegSteps steps of 32 entries of each chunk into its
// lanes' registers (plans whose entries shared memory alone cannot hold: 256 threads of up to
// 255 registers), the rest into shared memory. The host models the same layout from the mask
// (rnncc/variants/pieces.py) to know it fits. A step:
//
// - wait for the head's blocks (a counter per (head, batch chunk), as on grid_mma), copy the
//   operand (h, or dg's rows of kBwGates gates, or half of either: a chunk of columns at a
//   time) from the exchange buffer into shared memory ([column][kNB rows], 16-bit), and for
//   each chunk each warp runs its rounds: a lane takes one entry a step, reads the operand's
//   kNB values of its column in one load and adds value x those into kNB sums; at a round's
//   end each lane stores its sums as its piece's (shared memory), and after the chunk the
//   block adds each slot's pieces up (`fold`);
// - forward: the cell threads (unit, pair of rows) run C::forward on the gate sums and publish
//   the new h; backward: the cell threads (row, pair of units) run C::backward, publish the
//   gate cotangents, and add the block's sums (Rᵀ dg of their units) into the states'.
//
// Full-length sequences only (no kTimeline): lengths and the reverse direction take the dense
// variants. Templated on the generated cell struct C: its shape and the plan's kU, kNB,
// kSparseThreads, kFwEntries / kBwEntries (each block's shared-memory capacity), kFwSmem /
// kBwSmem, kBwGates, kFwSplit / kBwSplit, kFwRegSteps / kBwRegSteps, kFwRounds / kBwRounds
// and kScratch (a block's scratch words).
#pragma once
#include <type_traits>

#include "cooperative.cuh"
#include "mma_common.cuh"
#include "step_trace.cuh"

namespace rnncc {
namespace grid_sparse {

template <class C>
struct Kernels : MmaCommon<C> {
  using Base = MmaCommon<C>;
  using Base::kS, Base::kO, Base::kGx, Base::kGr, Base::kGb, Base::kP, Base::kRec, Base::kD, Base::kRows;
  using Base::kPairs, Base::put2, Base::load_step_inputs;
  using typename Base::SumOverTime, typename Base::StepResults, typename Base::BackwardOut;
  template <typename T>
  using StepInputs = typename Base::template StepInputs<T>;
  template <typename T>
  using ForwardIn = typename Base::template ForwardIn<T>;
  template <typename T, int kLen>
  using BackwardIn = typename Base::template BackwardIn<T, kLen>;

  static constexpr int kNB = C::kNB, kU = C::kU, kThreads = C::kSparseThreads, kWarps = kThreads / 32;
  static constexpr int kK = (kGr > 0 ? kGr : 1) * kD;  // exchange values per batch row: dg's gate rows (h fits)
  static_assert(!C::kTimeline, "sparse kernels run full-length sequences in one direction");
  static_assert(kGr > 0, "a sparse R needs an R");
  static_assert(kU % 2 == 0 && (kNB == 4 || kNB == 8), "pairs of units, 4 or 8 batch rows");
  static_assert(kD <= 65536, "a column index fits 16 bits");
  static_assert(kU * kNB / 2 <= kThreads, "a cell thread per (unit, row pair) and (row, unit pair)");

  // Steps of 32 entries a warp runs at once, their operand loads in flight together.
  static constexpr int kBlock = 4;

  // The shared memory of one direction, in bytes from the start: the entries, the pieces'
  // sums (kNB floats a piece), the operand's chunk, the slots' sums, the entries' start per
  // (chunk, slot) (after the prologue: each slot's first piece), each (chunk, warp, round)'s
  // end, each (chunk, warp)'s first shared entry, and (backward) the biases and params of the
  // block's units. The plan sizes the whole (kFwSmem, kBwSmem) with the same sums.
  template <bool Fw>
  struct Shape {
    static constexpr int kSlots = Fw ? kGr * kU : kU;
    // The operand in chunks of kCols columns: the forward's h whole; the backward's dg whole or
    // a gate's rows at a time, as the plan says (kBwGates: all gates where their rows fit); each
    // in kSplit halves where the entries fit only beside half of that (kFwSplit, kBwSplit).
    static constexpr int kSplit = Fw ? C::kFwSplit : C::kBwSplit;
    static constexpr int kCols = (Fw ? kD : C::kBwGates * kD) / kSplit;
    static constexpr int kChunks = kSplit * (Fw ? 1 : kGr / C::kBwGates);
    static constexpr int kCap = Fw ? C::kFwEntries : C::kBwEntries;
    // Each chunk's entries in kPieces pieces, dealt as kRounds rounds of 32 to every warp.
    static constexpr int kRounds = Fw ? C::kFwRounds : C::kBwRounds;
    static constexpr int kPieces = 32 * kWarps * kRounds;
    // Register steps per chunk: a lane holds the entries of its warp's first kRegSteps steps of
    // each chunk (32 entries a step) in registers, the rest in shared memory.
    static constexpr int kRegSteps = Fw ? C::kFwRegSteps : C::kBwRegSteps;
    static constexpr int kRegs = kRegSteps * kChunks;
    static constexpr int kRegBlocks = (kRegSteps + kBlock - 1) / kBlock * kBlock;  // the steps of blocks with register entries
    static constexpr int kParts = 4 * kCap;
    static constexpr int kOperand = kParts + 4 * kPieces * kNB;
    static constexpr int kSums = kOperand + 2 * kCols * kNB;
    static constexpr int kStart = kSums + 4 * kSlots * kNB;
    static constexpr int kEnds = kStart + 4 * (kChunks * kSlots + 1);
    static constexpr int kShift = kEnds + 4 * kChunks * kWarps * kRounds;
    static constexpr int kSide = kShift + 4 * kChunks * kWarps;
    static constexpr int kBytes = kSide + (Fw ? 0 : 4 * ((kGb > 0 ? kGb : 1) + (kP > 0 ? kP : 1)) * kU);
    // The block's scratch (32-bit words): the register steps on their way (per chunk, warp,
    // step, lane), each (chunk, slot)'s entries per bank group and its pieces, each (chunk,
    // warp, round, lane)'s piece and its slot, then the entries as the prologue finds them.
    static constexpr int kScrGroups = kRegs * kThreads;
    static constexpr int kScrCount = kScrGroups + kChunks * kSlots * (128 / (2 * kNB));
    static constexpr int kScrPiece = kScrCount + kChunks * kSlots;
    static constexpr int kScrSlot = kScrPiece + kChunks * kPieces;
    static constexpr int kScrEntries = kScrSlot + kChunks * kPieces;
    static_assert(kCap % 4 == 0 && kCap > 0, "the pieces' sums and the operand 16-byte aligned");
    static_assert(Fw || (kGr % C::kBwGates == 0 && kCols <= 65536), "whole chunks; a column fits 16 bits");
    static_assert((kSplit == 1 || kSplit == 2) && kD % kSplit == 0, "h or a gate's rows in halves");
    static_assert(kBytes <= (Fw ? C::kFwSmem : C::kBwSmem), "the plan's shared memory holds the kernel's");
    static_assert(kRounds > 0 && kPieces >= kSlots && kPieces <= 65536, "a piece or more a slot; 16-bit pieces");
    static_assert(kCap >= 3 * kSlots + kPieces + 2, "the entries' space holds the prologue's workspace");
    static_assert(kScrEntries < C::kScratch, "the scratch holds the prologue's tables");
  };

  // The exchange of a (head, batch chunk): 16-bit values [2][NH][chunks][kK][kNB] (slot by step
  // parity), then the counters [NH][chunks]; each block adds 1 to its counter per step.
  struct Exchange {
    unsigned short* out;
    long long slot_size;
    unsigned* counter;
    __device__ Exchange(unsigned* xchg, const int NH, const int chunks, const int n, const int c) {
      const long long per = (long long)kK * kNB;
      out = reinterpret_cast<unsigned short*>(xchg) + ((long long)n * chunks + c) * per;
      slot_size = (long long)NH * chunks * per;
      counter = xchg + slot_size + (long long)n * chunks + c;  // past both slots (32-bit words)
    }
    __device__ __forceinline__ unsigned short* slot(const int s) const { return out + (s & 1) * slot_size; }
    // This block's scratch, past the counters from the next multiple of 4 words: the entries
    // as the prologue finds them (C::kScratch words a block of the launch), read back into
    // registers and shared memory before the first step.
    static __device__ uint32_t* scratch(unsigned* xchg, const int NH, const int chunks) {
      const long long counters = (long long)NH * chunks * kK * kNB + (long long)NH * chunks;  // 32-bit words
      const long long block = ((long long)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
      return xchg + (counters + 3) / 4 * 4 + block * C::kScratch;
    }
  };

  // Stage chunk c of an exchange slot (columns [c kCols, c kCols + kCols)) into the operand
  // (L2 only: other SMs wrote them). Beside a thread's register entries, by 16-byte cp.async
  // (every copy in flight at once, through no registers) where the chunk and the slots are
  // 16-byte aligned; else by 8-byte loads, kBatch in flight before their stores (a whole gate
  // set of dg at 8 rows would take 72 registers at once).
  template <bool Fw>
  static __device__ __forceinline__ void stage(unsigned char* smem, const unsigned short* slot, const int c) {
    using Sh = Shape<Fw>;
    if constexpr (Sh::kRegs > 0 && Sh::kCols * kNB % 8 == 0 && kK * kNB % 8 == 0) {
      const char* const src = reinterpret_cast<const char*>(slot + (long long)c * Sh::kCols * kNB);
      const uint32_t dst = (uint32_t)__cvta_generic_to_shared(smem + Sh::kOperand);
      for (int i = threadIdx.x; i < Sh::kCols * kNB / 8; i += kThreads)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst + 16 * i), "l"(src + 16 * i) : "memory");
      asm volatile("cp.async.wait_all;" ::: "memory");
    } else {
      constexpr int kVecs = Sh::kCols * kNB / 4, kIter = (kVecs + kThreads - 1) / kThreads,
                    kBatch = Sh::kRegs > 0 ? 4 : 12;
      const uint2* src = reinterpret_cast<const uint2*>(slot + (long long)c * Sh::kCols * kNB) + threadIdx.x;
      uint2* dst = reinterpret_cast<uint2*>(smem + Sh::kOperand) + threadIdx.x;
#pragma unroll
      for (int i0 = 0; i0 < kIter; i0 += kBatch) {
        uint2 v[kBatch];
#pragma unroll
        for (int i = 0; i < kBatch; ++i)
          if (i0 + i < kIter && threadIdx.x + (i0 + i) * kThreads < kVecs) v[i] = __ldcg(src + (i0 + i) * kThreads);
#pragma unroll
        for (int i = 0; i < kBatch; ++i)
          if (i0 + i < kIter && threadIdx.x + (i0 + i) * kThreads < kVecs) dst[(i0 + i) * kThreads] = v[i];
      }
    }
  }

  // Bank groups of the operand: a column's kNB 16-bit values are 2 kNB bytes, so columns j and
  // j + kBanks share banks. Shared memory serves 128 bytes a wavefront, so a warp's load of 32
  // columns takes 32 / kBanks wavefronts at best, each of kBanks lanes in a row.
  static constexpr int kBanks = 128 / (2 * kNB);

  // The non-zeros of the block's strips into its scratch (see the file's comment). `at(s, j)`:
  // the 16-bit pattern of strip s's column j (j < kChunks kCols; chunk j / kCols). Within a
  // (chunk, slot), the entries go by bank group (a column's group: j % kBanks), in column
  // order within one, and each group's count goes to the scratch's groups: a piece can then
  // take its entries group by group (`distribute`). Chunk by chunk, each strip is read twice:
  // each lane's count of its columns' non-zeros (so each group's and the slot's), then the
  // entries. A warp takes a slot's 32 kLoads columns at a time. The forward's strips are rows
  // of R, read straight from it (a warp's 32 columns are adjacent); the backward's are columns,
  // so the block first copies a tile of kTile columns of every slot into shared memory, a
  // row of R's (kU adjacent values) at a time, and its warps read their slots from there.
  // The shared memory of the entries is free until `distribute`: each (slot, lane)'s count
  // or next entry, then the tile.
  static constexpr int kLoads = 8;  // a lane's loads in flight
  static constexpr int kTile = 32 * kLoads;
  template <bool Fw, class At>
  static __device__ void gather(unsigned char* smem, uint32_t* const scratch, const At& at) {
    using Sh = Shape<Fw>;
    static_assert(4 * 32 * Sh::kSlots + (Fw ? 0 : 2 * kTile * Sh::kSlots) <= 4 * Sh::kCap,
                  "the prologue's counts and tile fit the entries' space");
    int* const start = reinterpret_cast<int*>(smem + Sh::kStart);
    int* const state = reinterpret_cast<int*>(smem);  // [slot][lane]
    unsigned short* const tile = reinterpret_cast<unsigned short*>(smem + 4 * 32 * Sh::kSlots);  // [column][slot]
    uint32_t* const ent = scratch + Sh::kScrEntries;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, group = lane % kBanks;
    auto nonzero = [](const unsigned short v) { return (v & 0x7fffu) != 0; };
    // the tile of chunk c's columns [j0, j0 + kTile) (backward; a barrier before and after)
    auto load_tile = [&](const int c, const int j0) {
      if constexpr (!Fw) {
        __syncthreads();
        constexpr int kCount = kTile * Sh::kSlots, kBatch = 8;
        for (int i0 = threadIdx.x; i0 < kCount; i0 += kBatch * kThreads) {
          unsigned short v[kBatch];
#pragma unroll
          for (int b = 0; b < kBatch; ++b) {
            const int i = i0 + b * kThreads, j = j0 + i / Sh::kSlots;
            v[b] = i < kCount && j < Sh::kCols ? at(i % Sh::kSlots, c * Sh::kCols + j) : (unsigned short)0;
          }
#pragma unroll
          for (int b = 0; b < kBatch; ++b)
            if (i0 + b * kThreads < kCount) tile[i0 + b * kThreads] = v[b];
        }
        __syncthreads();
      }
    };
    // lane's columns j0 + 32 i + lane (i < kLoads) of slot s, chunk c: 0 past the strip
    auto load = [&](const int s, const int c, const int j0, unsigned short (&v)[kLoads]) {
#pragma unroll
      for (int i = 0; i < kLoads; ++i) {
        const int j = j0 + 32 * i + lane;
        if constexpr (Fw)
          v[i] = j < Sh::kCols ? at(s, c * Sh::kCols + j) : (unsigned short)0;
        else
          v[i] = tile[(32 * i + lane) * Sh::kSlots + s];  // 0 past the strip (load_tile)
      }
    };
    unsigned same = 0;  // the lanes of this lane's bank group
    for (int l = group; l < 32; l += kBanks) same |= 1u << l;
    const unsigned below = (1u << lane) - 1u;
    int run = 0;  // entries before chunk c (thread 0's)
    for (int c = 0; c < Sh::kChunks; ++c) {
      for (int s = warp; s < Sh::kSlots; s += kWarps) state[s * 32 + lane] = 0;
      for (int j0 = 0; j0 < Sh::kCols; j0 += kTile) {
        load_tile(c, j0);
        for (int s = warp; s < Sh::kSlots; s += kWarps) {
          unsigned short v[kLoads];
          load(s, c, j0, v);
          int mine = 0;
#pragma unroll
          for (int i = 0; i < kLoads; ++i) mine += nonzero(v[i]) ? 1 : 0;
          state[s * 32 + lane] += mine;
        }
      }
      for (int s = warp; s < Sh::kSlots; s += kWarps) {  // each group's count, the slot's
        int mine = state[s * 32 + lane];
#pragma unroll
        for (int o = kBanks; o < 32; o <<= 1) mine += __shfl_xor_sync(0xffffffffu, mine, o);
        if (lane < kBanks) scratch[Sh::kScrGroups + (c * Sh::kSlots + s) * kBanks + lane] = mine;
        int below_group = 0, total = 0;  // entries of the groups before this lane's, of all
#pragma unroll
        for (int k = 0; k < kBanks; ++k) {
          const int n = __shfl_sync(0xffffffffu, mine, k);
          below_group += k < group ? n : 0;
          total += n;
        }
        state[s * 32 + lane] = below_group;
        if (lane == 0) start[c * Sh::kSlots + s] = total;
      }
      __syncthreads();
      if (threadIdx.x == 0) {  // once per chunk: a few dozen slots
        for (int s = 0; s < Sh::kSlots; ++s) {
          const int v = start[c * Sh::kSlots + s];
          start[c * Sh::kSlots + s] = run;
          run += v;
        }
        start[Sh::kChunks * Sh::kSlots] = run;
        if (run > C::kScratch - Sh::kScrEntries) __trap();  // the host checked the mask's strips against the capacity
      }
      __syncthreads();
      for (int s = warp; s < Sh::kSlots; s += kWarps) state[s * 32 + lane] += start[c * Sh::kSlots + s];  // the group's first
      for (int j0 = 0; j0 < Sh::kCols; j0 += kTile) {
        load_tile(c, j0);
        for (int s = warp; s < Sh::kSlots; s += kWarps) {
          unsigned short v[kLoads];
          load(s, c, j0, v);
          int pos = state[s * 32 + lane];
#pragma unroll
          for (int i = 0; i < kLoads; ++i) {
            const unsigned m = __ballot_sync(0xffffffffu, nonzero(v[i])) & same;
            if (nonzero(v[i])) ent[pos + __popc(m & below)] = ((uint32_t)v[i] << 16) | column_bits<Fw>(j0 + 32 * i + lane);
            pos += __popc(m);
          }
          state[s * 32 + lane] = pos;
        }
      }
      __syncthreads();
    }
  }

  // The entries the prologue found (the scratch's, in the order of `start`) to where the steps
  // read them. Each chunk's slots are cut into exactly kPieces pieces: a piece for each slot
  // with entries and the rest in proportion to their entries (largest remainder), piece k of a
  // slot of p taking its entries k, k + p, k + 2p, ... of each bank group. The pieces, longest
  // first, go 32 at a time to the warps' rounds (a snake over the warps, and over the chunks'
  // rounds: every warp runs kRounds rounds a chunk, each as long as its longest piece; one that
  // ends among the register steps is rounded up to whole blocks of 4), lane l of a round
  // running one piece whole: no slot ends inside a round, at whose end each lane stores its
  // sums as its piece's (`product`; `fold` adds a slot's up). A lane takes its piece's entries
  // in the order that at step i prefers bank group (i + l) % kBanks: while their groups last, a
  // step's 32 lanes read every group twice, the fewest wavefronts (the bank-aware layout of
  // Sparse Persistent RNNs).
  // A warp's first kRegSteps steps of each chunk go into its lanes' registers (`re`, chunk by
  // chunk), the rest into shared memory (chunk by chunk, warp by warp); steps past a piece's
  // end hold 0 (value 0, column 0).
  template <bool Fw>
  static __device__ void distribute(unsigned char* smem, uint32_t* const scratch, uint32_t (&re)[Shape<Fw>::kRegs > 0 ? Shape<Fw>::kRegs : 1]) {
    using Sh = Shape<Fw>;
    const int* const start = reinterpret_cast<const int*>(smem + Sh::kStart);
    int* const ends = reinterpret_cast<int*>(smem + Sh::kEnds);
    int* const shift = reinterpret_cast<int*>(smem + Sh::kShift);
    uint32_t* const pieces = scratch + Sh::kScrCount;  // per (chunk, slot)
    uint32_t* const piece = scratch + Sh::kScrPiece;
    uint32_t* const slot_of = scratch + Sh::kScrSlot;
    // workspace in the entries' space, until the pieces are dealt: each slot's pieces and
    // remainder, its first piece, each piece's length, the pieces left to give out
    int* const count = reinterpret_cast<int*>(smem);
    int* const rem = count + Sh::kSlots;
    int* const first = rem + Sh::kSlots;
    int* const len = first + Sh::kSlots + 1;
    int* const left = len + Sh::kPieces;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    auto slot_at = [&](const int i) {  // the slot of piece i: the last with first[s] <= i
      int lo = 0, hi = Sh::kSlots;
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (first[mid] <= i)
          lo = mid;
        else
          hi = mid;
      }
      return lo;
    };
    for (int c = 0; c < Sh::kChunks; ++c) {
      const int* const st = start + c * Sh::kSlots;
      const int total = st[Sh::kSlots] - st[0];
      int nonempty = 0;  // slots with entries
      for (int s = 0; s < Sh::kSlots; ++s) nonempty += st[s + 1] > st[s] ? 1 : 0;
      if (threadIdx.x == 0) *left = Sh::kPieces;
      for (int s = threadIdx.x; s < Sh::kSlots; s += kThreads) rem[s] = -1;
      __syncthreads();
      for (int s = threadIdx.x; s < Sh::kSlots; s += kThreads) {
        const int n = st[s + 1] - st[s];
        if (n > 0) {
          const long long x = (long long)n * (Sh::kPieces - nonempty);
          count[s] = 1 + (int)(x / total);
          rem[s] = (int)(x % total);
          atomicSub(left, 1 + (int)(x / total));
        } else {
          count[s] = s == 0 && nonempty == 0 ? Sh::kPieces : 0;  // no entries: all empty
        }
      }
      __syncthreads();
      for (int s = threadIdx.x; s < Sh::kSlots; s += kThreads) {
        if (rem[s] < 0) continue;
        int rank = 0;  // among the slots by remainder, largest first
        for (int t = 0; t < Sh::kSlots; ++t) rank += rem[t] > rem[s] || (rem[t] == rem[s] && t < s) ? 1 : 0;
        if (rank < *left) ++count[s];
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        int run = 0;
        for (int s = 0; s < Sh::kSlots; ++s) {
          first[s] = run;
          run += count[s];
        }
        first[Sh::kSlots] = run;
        if (run != Sh::kPieces) __trap();
      }
      __syncthreads();
      for (int i = threadIdx.x; i < Sh::kPieces; i += kThreads) {
        const int s = slot_at(i), k = i - first[s], p = count[s], n = st[s + 1] - st[s];
        len[i] = n > k ? (n - k + p - 1) / p : 0;
      }
      __syncthreads();
      for (int i = threadIdx.x; i < Sh::kPieces; i += kThreads) {
        const int li = len[i];
        int q = 0;  // rank: longest first, then in order (a slot's pieces on adjacent lanes)
        for (int j = 0; j < Sh::kPieces; ++j) q += len[j] > li || (len[j] == li && j < i) ? 1 : 0;
        const int s = slot_at(i), r = q / 32, l = q % 32, kk = r / kWarps, wi = r % kWarps;
        const int at = (c * kWarps + ((c * Sh::kRounds + kk) % 2 ? kWarps - 1 - wi : wi)) * Sh::kRounds + kk;
        slot_of[32 * at + l] = (uint32_t)s | (uint32_t)i << 16;  // its slot, and where its sums go
        piece[32 * at + l] = (uint32_t)(i - first[s]);
        if (l == 0) ends[at] = li;
      }
      for (int s = threadIdx.x; s < Sh::kSlots; s += kThreads) pieces[c * Sh::kSlots + s] = (uint32_t)count[s];
      __syncthreads();
    }
    for (int i = threadIdx.x; i < Sh::kChunks * kWarps; i += kThreads) {
      int run = 0;
      for (int kk = 0; kk < Sh::kRounds; ++kk) {
        run += ends[i * Sh::kRounds + kk];
        if (run <= Sh::kRegBlocks) run = (run + kBlock - 1) / kBlock * kBlock;  // whole register blocks
        ends[i * Sh::kRounds + kk] = run;
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int run = 0;
      for (int i = 0; i < Sh::kChunks * kWarps; ++i) {
        shift[i] = run;
        run += 32 * max(0, ends[(i + 1) * Sh::kRounds - 1] - Sh::kRegSteps);
      }
      if (run > Sh::kCap) __trap();  // the host checked the mask's pieces against the capacity
    }
    __syncthreads();
    uint32_t* const ent = reinterpret_cast<uint32_t*>(smem);
    const uint32_t* const found = scratch + Sh::kScrEntries;
    uint32_t* const staging = scratch;
    for (int c = 0; c < Sh::kChunks; ++c) {
      const int cw = c * kWarps + warp;
      int j = 0;  // the warp's step
      for (int kk = 0; kk < Sh::kRounds; ++kk) {
        const int at = cw * Sh::kRounds + kk, s = (int)(__ldcg(slot_of + 32 * at + lane) & 0xffffu);
        const int k = (int)__ldcg(piece + 32 * at + lane);
        const int p = (int)__ldcg(pieces + c * Sh::kSlots + s), base = start[c * Sh::kSlots + s];
        const uint32_t* const groups = scratch + Sh::kScrGroups + (c * Sh::kSlots + s) * kBanks;
        int next[kBanks], bound[kBanks];  // per group: the piece's next entry, the group's end
        unsigned live = 0;                // the groups the piece has entries left in
        int a = 0;
#pragma unroll
        for (int g = 0; g < kBanks; ++g) {
          const int b = a + (int)__ldcg(groups + g);
          next[g] = k + (a > k ? (a - k + p - 1) / p : 0) * p;
          bound[g] = b;
          if (next[g] < b) live |= 1u << g;
          a = b;
        }
        for (const int j0 = j, end = ends[at]; j < end; ++j) {
          uint32_t e = 0u;
          if (live) {
            const int from = (j - j0 + lane) % kBanks;
            const unsigned turned = ((live >> from) | (live << (kBanks - from))) & ((1u << kBanks) - 1u);
            const int g = (from + __ffs(turned) - 1) % kBanks;
            int idx = 0;
#pragma unroll
            for (int h = 0; h < kBanks; ++h)
              if (h == g) {
                idx = next[h];
                next[h] += p;
                if (next[h] >= bound[h]) live &= ~(1u << h);
              }
            e = __ldcg(found + base + idx);
          }
          if (j < Sh::kRegSteps)
            staging[(cw * Sh::kRegSteps + j) * 32 + lane] = e;
          else
            ent[shift[cw] + (j - Sh::kRegSteps) * 32 + lane] = e;
        }
      }
    }
    if constexpr (Sh::kRegs > 0) {
#pragma unroll
      for (int c = 0; c < Sh::kChunks; ++c)
#pragma unroll
        for (int j = 0; j < Sh::kRegSteps; ++j) re[c * Sh::kRegSteps + j] = staging[((c * kWarps + warp) * Sh::kRegSteps + j) * 32 + lane];
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // each (chunk, slot)'s first piece, counted over the chunks (`fold`)
      int* const first = reinterpret_cast<int*>(smem + Sh::kStart);
      int run = 0;
      for (int i = 0; i < Sh::kChunks * Sh::kSlots; ++i) {
        first[i] = run;
        run += (int)__ldcg(pieces + i);
      }
      first[Sh::kChunks * Sh::kSlots] = run;
    }
    __syncthreads();
  }

  template <typename T>
  static __device__ __forceinline__ float value(const uint32_t e) {
    if constexpr (std::is_same<T, __nv_bfloat16>::value)
      return __uint_as_float(e & 0xffff0000u);
    else
      return __half2float(__ushort_as_half((unsigned short)(e >> 16)));
  }
  // Two 16-bit values of adjacent rows as floats.
  template <typename T>
  static __device__ __forceinline__ float2 pair(const uint32_t w) {
    if constexpr (std::is_same<T, __nv_bfloat16>::value)
      return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
    else
      return __half22float2(*reinterpret_cast<const __half2*>(&w));
  }

  // A column's kNB operand values: one load.
  typedef typename std::conditional<kNB == 4, uint2, uint4>::type Vec;

  // An entry's low 16 bits: its column's byte offset in the operand's chunk where those fit 16
  // bits (a load's address is then one mask away), else its column.
  template <bool Fw>
  static constexpr bool kByteColumns = Shape<Fw>::kCols * (long long)sizeof(Vec) <= 65536;
  template <bool Fw>
  static __device__ __forceinline__ uint32_t column_bits(const int j) {
    return (uint32_t)j * (kByteColumns<Fw> ? (uint32_t)sizeof(Vec) : 1u);
  }

  // The operand's kNB values of entry w's column (`op`: the operand's shared-memory address),
  // as one volatile asm: the compiler neither hoists these loads nor keeps their addresses ahead of
  // them, which with a thread's entries in registers would spill.
  template <bool Fw>
  static __device__ __forceinline__ Vec load_column(const uint32_t op, const uint32_t w) {
    constexpr uint32_t kScale = kByteColumns<Fw> ? 1u : (uint32_t)sizeof(Vec);
    Vec h;
    if constexpr (kNB == 4)
      asm volatile(
          "{ .reg .b32 a;\n\t"
          "and.b32 a, %2, 0xffff;\n\t"
          "mad.lo.u32 a, a, %4, %3;\n\t"
          "ld.shared.v2.u32 {%0, %1}, [a]; }"
          : "=r"(h.x), "=r"(h.y)
          : "r"(w), "r"(op), "n"(kScale));
    else
      asm volatile(
          "{ .reg .b32 a;\n\t"
          "and.b32 a, %4, 0xffff;\n\t"
          "mad.lo.u32 a, a, %6, %5;\n\t"
          "ld.shared.v4.u32 {%0, %1, %2, %3}, [a]; }"
          : "=r"(h.x), "=r"(h.y), "=r"(h.z), "=r"(h.w)
          : "r"(w), "r"(op), "n"(kScale));
    return h;
  }
  // The same from shared memory's entries (the compiler's own load: `op` the operand).
  template <bool Fw>
  static __device__ __forceinline__ Vec column(const Vec* op, const uint32_t w) {
    if constexpr (kByteColumns<Fw>)
      return *reinterpret_cast<const Vec*>(reinterpret_cast<const char*>(op) + (w & 0xffffu));
    else
      return op[w & 0xffffu];
  }

  // acc[b] += entry w's value x the operand's row b of its column (h).
  template <typename T>
  static __device__ __forceinline__ void fma_entry(const uint32_t w, const Vec& h, float (&acc)[kNB]) {
    const float v = value<T>(w);
    const uint32_t* hw = reinterpret_cast<const uint32_t*>(&h);
#pragma unroll
    for (int b = 0; b < kNB / 2; ++b) {
      const float2 x = pair<T>(hw[b]);
      acc[2 * b] = fmaf(v, x.x, acc[2 * b]);
      acc[2 * b + 1] = fmaf(v, x.y, acc[2 * b + 1]);
    }
  }

  // Warp `warp`'s entries of chunk c (the operand staged) into the slots' sums: its rounds
  // (`distribute`), in blocks of kBlock steps, first those with register entries (constant
  // indices; a round that ends among them is whole blocks), then the shared ones (two blocks a
  // loop trip while the round has them; its last block may be shorter), the steps alternating
  // between two sums (two chains of adds; one at 8 rows, whose 8 sums are chains enough, and
  // 128 registers a thread would spill).
  // At a round's end a lane stores its sums as its piece's (`fold` adds them up by slot): no
  // atomics (shared-memory float atomics are compare-and-swap loops here) and a fixed order of
  // adds, so a step's sums do not depend on the warps' timing.

  template <typename T, bool Fw>
  static __device__ __forceinline__ void product(unsigned char* smem, const uint32_t* scratch, const int c,
                                                 const uint32_t (&re)[Shape<Fw>::kRegs > 0 ? Shape<Fw>::kRegs : 1]) {
    using Sh = Shape<Fw>;
    const Vec* const op = reinterpret_cast<const Vec*>(smem + Sh::kOperand);
    float* const parts = reinterpret_cast<float*>(smem + Sh::kParts);
    const int lane = threadIdx.x & 31, cw = c * kWarps + (threadIdx.x >> 5);
    const int* const ends = reinterpret_cast<const int*>(smem + Sh::kEnds) + cw * Sh::kRounds;
    const uint32_t* const slot_of = scratch + Sh::kScrSlot + 32 * cw * Sh::kRounds + lane;
    const int steps = ends[Sh::kRounds - 1];
    int round = 0, end = ends[0];
    uint32_t slot = __ldcg(slot_of);  // its slot, and (bits 16 on) its piece
    float acc[kNB], odd[kNB];
#pragma unroll
    for (int b = 0; b < kNB; ++b) acc[b] = odd[b] = 0.0f;
    // A round's end: the lane's sums to its piece's place (kNB floats, 16-byte stores).
    auto finish = [&]() {  // uniform
      float4* const to = reinterpret_cast<float4*>(parts + (slot >> 16) * kNB);
#pragma unroll
      for (int b = 0; b < kNB; b += 4)
        to[b / 4] = make_float4(acc[b] + odd[b], acc[b + 1] + odd[b + 1], acc[b + 2] + odd[b + 2], acc[b + 3] + odd[b + 3]);
#pragma unroll
      for (int b = 0; b < kNB; ++b) acc[b] = odd[b] = 0.0f;
      ++round;
      end = -1;
      if (round < Sh::kRounds) {
        end = ends[round];
        slot = __ldcg(slot_of + 32 * round);
      }
    };
    const uint32_t* const ent = reinterpret_cast<const uint32_t*>(smem) + reinterpret_cast<const int*>(smem + Sh::kShift)[cw] + lane;
    // entry i of the block at step j (j + i >= kRegSteps)
    auto shared_entry = [&](const int j, const int i) { return ent[32 * (j + i - Sh::kRegSteps)]; };
    constexpr int kWhole = Sh::kRegSteps / kBlock * kBlock, kMixed = Sh::kRegSteps - kWhole;
    if constexpr (Sh::kRegSteps > 0) {
      const uint32_t opa = (uint32_t)__cvta_generic_to_shared(op);
#pragma unroll
      for (int j0 = 0; j0 < kWhole; j0 += kBlock) {
        if (j0 >= steps) break;  // uniform
        Vec h[kBlock];
#pragma unroll
        for (int j = 0; j < kBlock; ++j) h[j] = load_column<Fw>(opa, re[c * Sh::kRegSteps + j0 + j]);
#pragma unroll
        for (int j = 0; j < kBlock; ++j) fma_entry<T>(re[c * Sh::kRegSteps + j0 + j], h[j], j % 2 ? odd : acc);
        if (j0 + kBlock == end) finish();
      }
      if constexpr (kMixed > 0) {  // a block of the last register steps and the first shared ones
        if (kWhole < steps) {
          uint32_t w[kBlock];
          Vec h[kBlock];
#pragma unroll
          for (int i = 0; i < kBlock; ++i) w[i] = i < kMixed ? re[c * Sh::kRegSteps + kWhole + i] : shared_entry(kWhole, i);
#pragma unroll
          for (int i = 0; i < kBlock; ++i) h[i] = load_column<Fw>(opa, w[i]);
#pragma unroll
          for (int i = 0; i < kBlock; ++i) fma_entry<T>(w[i], h[i], i % 2 ? odd : acc);
          if (kWhole + kBlock == end) finish();
        }
      }
    }
    // a block's shared steps, kInFlight loads at a time (16-byte loads at 8 rows: fewer)
    constexpr int kInFlight = kNB == 4 ? kBlock : kBlock / 2;
    auto shared_block = [&](const int j, const int n) {  // steps j to j + n (n < kBlock: 0 past them)
#pragma unroll
      for (int i0 = 0; i0 < kBlock; i0 += kInFlight) {
        uint32_t w[kInFlight];
        Vec h[kInFlight];
#pragma unroll
        for (int i = 0; i < kInFlight; ++i) w[i] = i0 + i < n ? shared_entry(j, i0 + i) : 0u;
#pragma unroll
        for (int i = 0; i < kInFlight; ++i) h[i] = column<Fw>(op, w[i]);
#pragma unroll
        for (int i = 0; i < kInFlight; ++i) fma_entry<T>(w[i], h[i], kNB == 4 && (i0 + i) % 2 ? odd : acc);
      }
    };
    for (int j = Sh::kRegBlocks; j < steps;) {
      if (j + 2 * kBlock <= end) {  // two blocks an iteration: half the loop's branches
        shared_block(j, kBlock);
        shared_block(j + kBlock, kBlock);
        j += 2 * kBlock;
      } else if (j + kBlock <= end) {
        shared_block(j, kBlock);  // a constant bound: no selects
        j += kBlock;
      } else {  // a round's last steps
        shared_block(j, end - j);
        j = end;
      }
      if (j == end) finish();
    }
    for (; round < Sh::kRounds; ++round) {  // rounds of empty pieces (a warp's last): sums of 0
      float4* const to = reinterpret_cast<float4*>(parts + (__ldcg(slot_of + 32 * round) >> 16) * kNB);
#pragma unroll
      for (int b = 0; b < kNB; b += 4) to[b / 4] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }

  // Chunk c's pieces' sums into the slots' (set at chunk 0, added to after): each (slot, row)'s
  // pieces in order, kLanes lanes each taking every kLanes-th and their sums added across them
  // (a slot's pieces are about kPieces / kSlots, from a few to a few dozen).
  template <bool Fw>
  static __device__ __forceinline__ void fold(unsigned char* smem, const int c) {
    using Sh = Shape<Fw>;
    const float* const parts = reinterpret_cast<const float*>(smem + Sh::kParts);
    float* const sums = reinterpret_cast<float*>(smem + Sh::kSums);
    const int* const first = reinterpret_cast<const int*>(smem + Sh::kStart) + c * Sh::kSlots;
    constexpr int kPer = Sh::kPieces / (4 * Sh::kSlots);  // a lane's pieces about 4 or fewer
    constexpr int kLanes = kPer >= 32 ? 32 : kPer >= 16 ? 16 : kPer >= 8 ? 8 : kPer >= 4 ? 4 : kPer >= 2 ? 2 : 1;
    constexpr int kValues = Sh::kSlots * kNB;
    const int lane = threadIdx.x & 31, sub = lane % kLanes, base = c * Sh::kPieces;
    for (int v0 = (threadIdx.x >> 5) * (32 / kLanes); v0 < kValues; v0 += kThreads / kLanes) {  // uniform
      const int v = v0 + lane / kLanes, s = v / kNB, b = v % kNB;
      float x = 0.0f;
      if (v < kValues) {
        const int hi = first[s + 1] - base;
#pragma unroll 4
        for (int i = first[s] - base + sub; i < hi; i += kLanes) x += parts[i * kNB + b];
      }
#pragma unroll
      for (int o = kLanes / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
      if (v < kValues && sub == 0) sums[v] = c == 0 ? x : sums[v] + x;
    }
  }

  template <typename T>
  static __device__ __forceinline__ void forward(const rnncc_fused_args& a, const int n0, const int c0) {
    using Sh = Shape<true>;
    extern __shared__ __align__(16) unsigned char smem[];
    float* const sums = reinterpret_cast<float*>(smem + Sh::kSums);
    const int u = blockIdx.x, n = n0 + blockIdx.y, c = c0 + blockIdx.z, b0 = c * kNB;
    const int chunks = (a.B + kNB - 1) / kNB;
    const long long NHD = (long long)a.NH * kD;
    const unsigned short* R = static_cast<const unsigned short*>(a.R);
    uint32_t* const scratch = Exchange::scratch(a.xchg, a.NH, chunks);
    gather<true>(smem, scratch, [&](const int s, const int j) -> unsigned short {
      const int k = s / kU, d = kU * u + s % kU;
      return d < kD ? R[(((long long)k * a.NH + n) * kD + d) * kD + j] : (unsigned short)0;
    });
    uint32_t re[Sh::kRegs > 0 ? Sh::kRegs : 1];
    distribute<true>(smem, scratch, re);

    // A cell thread: unit d = kU u + dl, rows b0 + 2 j + q (q < 2).
    const int dl = threadIdx.x % kU, j2 = threadIdx.x / kU;
    const int d = kU * u + dl;
    const bool cell = threadIdx.x < kU * kNB / 2, unit = cell && d < kD;
    const Exchange ex(a.xchg, a.NH, chunks, n, c);
    const T* bias = static_cast<const T*>(a.bias) + (long long)n * kD;
    const T* states = static_cast<const T*>(a.states);
    float st[kS][2], pv[kP > 0 ? kP : 1][2], bv[kGb > 0 ? kGb : 1][2];
    uint32_t wxv[kGx > 0 ? kGx : 1][2];
#pragma unroll
    for (int q = 0; q < 2; ++q) {
      const int gb = b0 + 2 * j2 + q;
      const bool live = unit && gb < a.B;
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
      if (live) ex.slot(0)[(long long)d * kNB + 2 * j2 + q] = rnncc::bits(rnncc::from_float<T>(st[kRec][q]));
    }
    __syncthreads();
    if (threadIdx.x == 0) rnncc::xchg_count(ex.counter);
    const unsigned blocks = gridDim.x;
    [[maybe_unused]] const long long yO = (long long)a.B * a.T * NHD;
    const long long NBD = (long long)a.NH * a.B * kD;
    T* const Y = static_cast<T*>(a.y);
    auto load_wx = [&](const int t) {
      const int tc = t < a.T ? t : a.T - 1;
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int gb = b0 + 2 * j2 + q;
        const bool live = unit && gb < a.B;
        const unsigned short* Wx = static_cast<const unsigned short*>(a.Wx) +
                                   (live ? ((long long)gb * a.T + tc) * kGx * NHD + (long long)n * kD + d : 0);
#pragma unroll
        for (int k = 0; k < kGx; ++k) wxv[k][q] = Wx[k * NHD];
      }
    };
    if (a.T > 0) load_wx(0);

    RNNCC_TRACE_INIT
    for (int t = 0; t < a.T; ++t) {
      RNNCC_TRACE(0)
      rnncc::xchg_wait(ex.counter, (unsigned)(t + 1) * blocks);
      RNNCC_TRACE(1)
#pragma unroll  // a chunk's register entries by constant indices
      for (int k = 0; k < Sh::kChunks; ++k) {  // h whole, or in halves
        stage<true>(smem, ex.slot(t), k);
        __syncthreads();
        RNNCC_TRACE(2)
        product<T, true>(smem, scratch, k, re);
        __syncthreads();
        fold<true>(smem, k);  // before the next chunk's barrier, or this one
        if (k == Sh::kChunks - 1) __syncthreads();
        RNNCC_TRACE(3)
      }
      float acc[kPairs][4];  // C fragment order (ForwardIn): gate 2 p + i / 2, row q = i % 2
      if (cell) {
#pragma unroll
        for (int p = 0; p < kPairs; ++p)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int k = 2 * p + i / 2, q = i % 2;
            acc[p][i] = k < kGr ? sums[(k * kU + dl) * kNB + 2 * j2 + q] : 0.0f;
          }
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int gb = b0 + 2 * j2 + q;
          if (unit && gb < a.B) {
            float next[kS];
            C::forward(ForwardIn<T>{st, wxv, acc, bv, pv, q}, next);
#pragma unroll
            for (int s = 0; s < kS; ++s) st[s][q] = next[s];
            ex.slot(t + 1)[(long long)d * kNB + 2 * j2 + q] = rnncc::bits(rnncc::from_float<T>(st[kRec][q]));
          }
        }
      }
      __syncthreads();
      RNNCC_TRACE(4)
      if (threadIdx.x == 0) rnncc::xchg_count(ex.counter);
      RNNCC_TRACE(5)
      if (cell) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int gb = b0 + 2 * j2 + q;
          if (unit && gb < a.B) {
            if (a.rh) {
#pragma unroll
              for (int k = 0; k < kGr; ++k)
                a.rh[(((long long)t * a.NH + n) * a.B + gb) * kRows + k * kD + d] = acc[k / 2][k % 2 * 2 + q];
            }
            T* const yp = Y + ((long long)gb * a.T + t) * NHD + (long long)n * kD + d;
#pragma unroll
            for (int o = 0; o < kO; ++o) yp[o * yO] = rnncc::from_float<T>(st[C::output_state(o)][q]);
            if (a.hist) {
              float* const h = a.hist + (t + 1) * kS * NBD + ((long long)n * a.B + gb) * kD + d;
#pragma unroll
              for (int s = 0; s < kS; ++s) h[s * NBD] = st[s][q];
            }
          }
        }
        load_wx(t + 1);
      }
      RNNCC_TRACE(6)
    }
    RNNCC_TRACE_PRINT("fw", kU, kThreads)
    if (cell) {
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int gb = b0 + 2 * j2 + q;
        if (unit && gb < a.B) {
#pragma unroll
          for (int s = 0; s < kS; ++s)
            static_cast<T*>(a.last)[(((long long)s * a.B + gb) * a.NH + n) * kD + d] = rnncc::from_float<T>(st[s][q]);
        }
      }
    }
  }
  template <typename T>
  static __device__ __forceinline__ void backward(const rnncc_fused_bwd_args& a, const int n0, const int c0) {
    using Sh = Shape<false>;
    extern __shared__ __align__(16) unsigned char smem[];
    float* const sums = reinterpret_cast<float*>(smem + Sh::kSums);
    float (*const bsm)[kU] = reinterpret_cast<float (*)[kU]>(smem + Sh::kSide);  // [kGb][kU], then [kP][kU]
    float (*const psm)[kU] = bsm + (kGb > 0 ? kGb : 1);
    const int u = blockIdx.x, n = n0 + blockIdx.y, c = c0 + blockIdx.z, b0 = c * kNB;
    const int chunks = (a.B + kNB - 1) / kNB;
    const long long NHD = (long long)a.NH * kD;
    const int d_blk = kU * u;
    const unsigned short* R = static_cast<const unsigned short*>(a.R);
    uint32_t* const scratch = Exchange::scratch(a.xchg, a.NH, chunks);
    gather<false>(smem, scratch, [&](const int s, const int j) -> unsigned short {
      const int d = d_blk + s, k = j / kD, row = j % kD;
      return d < kD ? R[(((long long)k * a.NH + n) * kD + row) * kD + d] : (unsigned short)0;
    });
    uint32_t re[Sh::kRegs > 0 ? Sh::kRegs : 1];
    distribute<false>(smem, scratch, re);
    if (threadIdx.x < kU) {
      const int du = d_blk + threadIdx.x;
      const T* bias = static_cast<const T*>(a.bias) + (long long)n * kD;
#pragma unroll
      for (int k = 0; k < kGb; ++k) bsm[k][threadIdx.x] = du < kD ? rnncc::to_float(bias[k * NHD + du]) : 0.0f;
#pragma unroll
      for (int p = 0; p < kP; ++p)
        psm[p][threadIdx.x] = du < kD ? rnncc::to_float(static_cast<const T*>(a.params)[((long long)p * a.NH + n) * kD + du]) : 0.0f;
    }
    // A cell thread: batch row gb = b0 + rr, units d0 + q (q < 2).
    const int dp = threadIdx.x % (kU / 2), rr = threadIdx.x / (kU / 2);
    const int d0 = d_blk + 2 * dp, gb = b0 + rr;
    const bool cell = threadIdx.x < kU * kNB / 2;
    const bool live = cell && d0 < kD && gb < a.B, hi = d0 + 1 < kD;
    const Exchange ex(a.xchg, a.NH, chunks, n, c);
    float ds[kS][2];
    SumOverTime totals;
#pragma unroll
    for (int q = 0; q < 2; ++q)
#pragma unroll
      for (int s = 0; s < kS; ++s)
        ds[s][q] = live && d0 + q < kD
                       ? rnncc::to_float(static_cast<const T*>(a.dlast)[(((long long)s * a.B + gb) * a.NH + n) * kD + d0 + q])
                       : 0.0f;
    __syncthreads();
    const unsigned blocks = gridDim.x;
    typedef StepInputs<T> Inputs;
    Inputs in;
    auto load_inputs = [&](const int t) {
      if (t >= 0 && cell) load_step_inputs(a, t, t, n, gb, d0, in);
    };
    load_inputs(a.T - 1);
    RNNCC_TRACE_INIT
    for (int t = a.T - 1; t >= 0; --t) {
      RNNCC_TRACE(0)
      float nd[kS][2];
      StepResults o;
      if (live) {
#pragma unroll
        for (int q = 0; q < 2; ++q) {
#pragma unroll
          for (int s = 0; s < kS; ++s) nd[s][q] = 0.0f;
          if (q == 0 || hi)
            C::backward(BackwardIn<T, kU>{in, &bsm[0][d0 + q - d_blk], &psm[0][d0 + q - d_blk], ds, q}, BackwardOut{nd, o, q});
        }
        unsigned short* const xs = ex.slot(t);
#pragma unroll
        for (int k = 0; k < kGr; ++k)
#pragma unroll
          for (int q = 0; q < 2; ++q)
            if (q == 0 || hi) xs[((long long)k * kD + d0 + q) * kNB + rr] = rnncc::bits(rnncc::from_float<T>(o.gr[k][q]));
        totals.add(o.gb, o.p);
      }
      __syncthreads();
      RNNCC_TRACE(1)
      if (threadIdx.x == 0) rnncc::xchg_count(ex.counter);
      RNNCC_TRACE(2)
      if (live) {  // dWx and dGr after the count: read only after the kernel
        T* const dWx = static_cast<T*>(a.dWx) + (((long long)gb * a.T + t) * kGx) * NHD + (long long)n * kD;
        T* const dGr = static_cast<T*>(a.dGr) + (((long long)n * a.T + t) * a.B + gb) * kRows;
#pragma unroll
        for (int k = 0; k < kGx; ++k)
          put2(dWx + k * NHD + d0, hi, rnncc::from_float<T>(o.wx[k][0]), rnncc::from_float<T>(o.wx[k][1]));
#pragma unroll
        for (int k = 0; k < kGr; ++k)
          put2(dGr + k * kD + d0, hi, rnncc::from_float<T>(o.gr[k][0]), rnncc::from_float<T>(o.gr[k][1]));
#pragma unroll
        for (int q = 0; q < 2; ++q)
#pragma unroll
          for (int s = 0; s < kS; ++s) ds[s][q] = nd[s][q];
      }
      load_inputs(t - 1);
      RNNCC_TRACE(3)
      rnncc::xchg_wait(ex.counter, (unsigned)(a.T - t) * blocks);
      RNNCC_TRACE(4)
#pragma unroll  // a chunk's register entries by constant indices
      for (int k = 0; k < Sh::kChunks; ++k) {  // dg whole, or a gate's rows at a time
        stage<false>(smem, ex.slot(t), k);
        __syncthreads();
        RNNCC_TRACE(5)
        product<T, false>(smem, scratch, k, re);
        __syncthreads();
        fold<false>(smem, k);  // before the next chunk's barrier, or this one
        if (k == Sh::kChunks - 1) __syncthreads();
        RNNCC_TRACE(6)
      }
      if (live) {
#pragma unroll
        for (int q = 0; q < 2; ++q) ds[kRec][q] += sums[(2 * dp + q) * kNB + rr];
      }
      RNNCC_TRACE(7)
    }
    RNNCC_TRACE_PRINT("bw", kU, kThreads)
    if (live) {
#pragma unroll
      for (int q = 0; q < 2; ++q)
        if (q == 0 || hi) {
#pragma unroll
          for (int s = 0; s < kS; ++s)
            static_cast<T*>(a.dstates)[(((long long)s * a.B + gb) * a.NH + n) * kD + d0 + q] = rnncc::from_float<T>(ds[s][q]);
        }
      totals.store(a, n, gb, d0);
    }
  }
};

template <class C, typename T>
__global__ void __launch_bounds__(C::kSparseThreads, 1) forward_kernel(const rnncc_fused_args a, const int n0, const int c0) {
  Kernels<C>::template forward<T>(a, n0, c0);
}

template <class C, typename T>
__global__ void __launch_bounds__(C::kSparseThreads, 1)
    backward_kernel(const rnncc_fused_bwd_args a, const int n0, const int c0) {
  Kernels<C>::template backward<T>(a, n0, c0);
}

// A direction's launches: cooperative (rnncc::launch_cooperative), the (head, batch chunk)
// pairs split over launches as the plan says (rnncc.variants.grid_sparse).
template <class C, typename T, bool Fw, typename Args>
int launch(const Args& a, const rnncc_launch& l, cudaStream_t stream) {
  void (*fn)(Args, int, int);
  if constexpr (Fw)
    fn = forward_kernel<C, T>;
  else
    fn = backward_kernel<C, T>;
  static rnncc::SmemLimit limit;
  if (l.kernel != 0 || l.grid_x != (C::kD + C::kU - 1) / C::kU) return (int)cudaErrorInvalidValue;
  const int chunks = (a.B + C::kNB - 1) / C::kNB;
  return rnncc::launch_cooperative(fn, a, l, C::kSparseThreads, Fw ? C::kFwSmem : C::kBwSmem, chunks, limit, stream);
}

template <class C, bool Fw, typename Args>
int entry(const Args* a, const rnncc_launch* l, cudaStream_t stream) {
  if (a->D != C::kD) return (int)cudaErrorInvalidValue;
  if ((long long)a->NH * a->B == 0) return 0;
  if (a->xchg == nullptr || a->xchg_words != Kernels<C>::kK) return (int)cudaErrorInvalidValue;
  switch (a->dtype) {
    case RNNCC_F16: return launch<C, __half, Fw>(*a, *l, stream);
    case RNNCC_BF16: return launch<C, __nv_bfloat16, Fw>(*a, *l, stream);
    default: return (int)cudaErrorNotSupported;
  }
}

template <class C>
int forward(const rnncc_fused_args* a, const rnncc_launch* l, cudaStream_t stream) {
  return entry<C, true>(a, l, stream);
}

template <class C>
int backward(const rnncc_fused_bwd_args* a, const rnncc_launch* l, cudaStream_t stream) {
  return entry<C, false>(a, l, stream);
}

}  // namespace grid_sparse
}  // namespace rnncc
