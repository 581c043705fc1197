// rnncc tensor-core helpers: the warp-wide mma.sync.m16n8k16 product with fp32 accumulators
// on 16-bit inputs (bf16 or fp16), or on fp32 inputs as three tf32 products (3xTF32), and
// packing two floats into one operand register.
//
// Fragment layout of m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"), with
// g = lane / 4 and c = lane % 4:
//   A (16 x 16, row-major), 4 registers: a0 = A[g][2c..2c+1],   a1 = A[g+8][2c..2c+1],
//                                        a2 = A[g][2c+8..2c+9], a3 = A[g+8][2c+8..2c+9]
//   B (16 x 8, k x n), 2 registers:      b0 = B[2c..2c+1][g],   b1 = B[2c+8..2c+9][g]
//   C (16 x 8, fp32), 4 registers:       c0 = C[g][2c], c1 = C[g][2c+1],
//                                        c2 = C[g+8][2c], c3 = C[g+8][2c+1]
//
// fp32 keeps that layout, each register a pair of floats (Operand<float>::Reg, uint2: x the
// even k, y the odd one): m16n8k8.tf32's fragments (a0 = A[g][c], a1 = A[g+8][c], a2 =
// A[g][c+4], a3 = A[g+8][c+4]; b0 = B[c][g], b1 = B[c+4][g]; C as above) of the tile's even
// columns k = 2κ are then the x halves a lane holds, and of its odd ones the y halves. So
// every kernel moves its fragments as it does for 16 bits, twice the bytes.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include <type_traits>

namespace rnncc {

// The product's operands for storage type T: Reg, one fragment register (a pair of adjacent k
// elements), Bits, one element's bits as stored in the exchange, Quad, four registers as one
// access (an A fragment; a lane loads and stores it whole).
template <typename T> struct Operand {  // bf16, fp16
  typedef uint32_t Reg;
  typedef unsigned short Bits;
  typedef uint4 Quad;
  typedef uint2 Duo;  // two registers
};
template <> struct Operand<float> {
  typedef uint2 Reg;
  typedef unsigned Bits;
  struct alignas(16) Quad { uint4 lo, hi; };
  typedef uint4 Duo;
};

// Four registers as one Quad, and back; two as one Duo, and back.
__device__ __forceinline__ uint4 quad(const uint32_t (&r)[4]) { return make_uint4(r[0], r[1], r[2], r[3]); }
__device__ __forceinline__ Operand<float>::Quad quad(const uint2 (&r)[4]) {
  return {make_uint4(r[0].x, r[0].y, r[1].x, r[1].y), make_uint4(r[2].x, r[2].y, r[3].x, r[3].y)};
}
__device__ __forceinline__ void unquad(const uint4& v, uint32_t (&r)[4]) {
  r[0] = v.x;
  r[1] = v.y;
  r[2] = v.z;
  r[3] = v.w;
}
__device__ __forceinline__ void unquad(const Operand<float>::Quad& v, uint2 (&r)[4]) {
  r[0] = make_uint2(v.lo.x, v.lo.y);
  r[1] = make_uint2(v.lo.z, v.lo.w);
  r[2] = make_uint2(v.hi.x, v.hi.y);
  r[3] = make_uint2(v.hi.z, v.hi.w);
}
__device__ __forceinline__ uint2 duo(const uint32_t r0, const uint32_t r1) { return make_uint2(r0, r1); }
__device__ __forceinline__ uint4 duo(const uint2 r0, const uint2 r1) { return make_uint4(r0.x, r0.y, r1.x, r1.y); }
__device__ __forceinline__ void unduo(const uint2& v, uint32_t& r0, uint32_t& r1) {
  r0 = v.x;
  r1 = v.y;
}
__device__ __forceinline__ void unduo(const uint4& v, uint2& r0, uint2& r1) {
  r0 = make_uint2(v.x, v.y);
  r1 = make_uint2(v.z, v.w);
}
// Loads and stores through L2 only (ld.global.cg / st.global.cg) of a Quad.
__device__ __forceinline__ uint4 ldcg(const uint4* p) { return __ldcg(p); }
__device__ __forceinline__ Operand<float>::Quad ldcg(const Operand<float>::Quad* p) {
  return {__ldcg(&p->lo), __ldcg(&p->hi)};
}
__device__ __forceinline__ void stcg(uint4* p, const uint4& v) { __stcg(p, v); }
__device__ __forceinline__ void stcg(Operand<float>::Quad* p, const Operand<float>::Quad& v) {
  __stcg(&p->lo, v.lo);
  __stcg(&p->hi, v.hi);
}

// Two floats rounded to T, low half first (the lower k or column index).
template <typename T> __device__ __forceinline__ typename Operand<T>::Reg pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <> __device__ __forceinline__ uint2 pack2<float>(float lo, float hi) {
  return make_uint2(__float_as_uint(lo), __float_as_uint(hi));
}

// c += A · B for one 16 x 8 x 16 tile, warp-wide; fp32 accumulation.
template <typename T>
__device__ __forceinline__ void mma16816(float (&c)[4], const typename Operand<T>::Reg (&a)[4],
                                         typename Operand<T>::Reg b0, typename Operand<T>::Reg b1);
template <>
__device__ __forceinline__ void mma16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4],
                                                        uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma16816<__half>(float (&c)[4], const uint32_t (&a)[4],
                                                 uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 3xTF32: x = big + small, big = x rounded to tf32, small = the rest (the tensor cores read a
// tf32 operand's 19 high bits: big rounded by adding half of its last place, small truncated);
// a product of two such sums is big·big + big·small + small·big to about fp32's accuracy (the
// dropped small·small is below 2^-20 of it), three m16n8k8.tf32 products. The split is asm
// volatile: an operand kept for the whole sequence (R) is split again at every use, rather
// than the compiler hoisting its splits out of the step loop and holding twice its registers.
__device__ __forceinline__ void split_tf32(const uint32_t x, uint32_t& big, uint32_t& small) {
  asm volatile(
      "{ .reg .b32 m; .reg .f32 r;\n"
      "  add.u32 %0, %2, 4096;\n"
      "  and.b32 m, %0, 0xffffe000;\n"
      "  sub.f32 r, %3, m;\n"
      "  mov.b32 %1, r; }"
      : "=r"(big), "=r"(small)
      : "r"(x), "f"(__uint_as_float(x)));
}
__device__ __forceinline__ void mma1688_tf32(float (&c)[4], const uint32_t (&a)[4], const uint32_t b0, const uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// The tile's four products of small parts (big·small, small·big of each k8 half) go into an
// accumulator of their own, added to c once: c's chain of dependent mma (a kernel's product
// runs one per k tile) is then two per tile rather than six.
template <>
__device__ __forceinline__ void mma16816<float>(float (&c)[4], const uint2 (&a)[4], uint2 b0, uint2 b1) {
  uint32_t ab[2][4], as[2][4], bb[2][2], bs[2][2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // h = 0: the even k (x halves), 1: the odd k (y)
#pragma unroll
    for (int i = 0; i < 4; ++i) split_tf32(h ? a[i].y : a[i].x, ab[h][i], as[h][i]);
    split_tf32(h ? b0.y : b0.x, bb[h][0], bs[h][0]);
    split_tf32(h ? b1.y : b1.x, bb[h][1], bs[h][1]);
  }
  float t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    mma1688_tf32(t, as[h], bb[h][0], bb[h][1]);
    mma1688_tf32(t, ab[h], bs[h][0], bs[h][1]);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) mma1688_tf32(c, ab[h], bb[h][0], bb[h][1]);
#pragma unroll
  for (int i = 0; i < 4; ++i) c[i] += t[i];
}

}  // namespace rnncc

namespace rnncc {

// The L2 prefetches per thread (L2Stream's kMax) of `slices` slices of at most `len_bytes`.
__host__ __device__ constexpr int l2_lines_per_thread(int slices, int len_bytes, int nthreads) {
  return (slices * ((len_bytes + 127) / 128 + 1) + nthreads - 1) / nthreads;
}

// Prefetch into L2, every step, the elements [s, s + len) of the outer x inner slices
// s = p + i * outer_stride + j * inner_stride (i < outer, j < inner) moved on by a fixed stride
// per step, their 128-byte lines shared out over the block's threads (thread `tid` of
// `nthreads`). A persistent kernel prefetches some steps ahead of the loads that need the
// data, so that they find it in L2: a DRAM load can take longer than a whole step. A thread's
// addresses are worked out once (at most kMax of them); a step then costs one add and one
// prefetch per address. Worked out every step, the index arithmetic (integer divisions
// among it) would make the warps that run it the last at each step's barrier.
// A slice's addresses are its start and every 128 bytes on, the last clamped to its last
// byte: each line it overlaps, and nothing outside it, wherever a step puts it.
template <int kMax>
struct L2Stream {
  const char* at[kMax > 0 ? kMax : 1];

  template <typename E>
  __device__ __forceinline__ void init(const E* p, long long outer_stride, int outer, long long inner_stride,
                                       int inner, int len, int tid, int nthreads) {
    const int bytes = len * (int)sizeof(E), lines = (bytes + 127) / 128 + 1;
#pragma unroll
    for (int i = 0; i < kMax; ++i) {
      const int k = tid + i * nthreads, slice = k / lines, line = k % lines;
      at[i] = nullptr;
      if (k < outer * inner * lines && bytes > 0) {
        const E* s = p + (slice / inner) * outer_stride + (slice % inner) * inner_stride;
        at[i] = reinterpret_cast<const char*>(s) + (128 * line < bytes - 1 ? 128 * line : bytes - 1);
      }
    }
  }

  // This thread's addresses moved on by `offset` bytes.
  __device__ __forceinline__ void prefetch(long long offset) const {
#pragma unroll
    for (int i = 0; i < kMax; ++i)
      if (at[i] != nullptr) asm volatile("prefetch.global.L2 [%0];" ::"l"(at[i] + offset));
  }
};

// L2Stream over a timeline (timeline.cuh): the slices of outer row r (of `outer`, length
// length(r)) hold position s of that row at p + s * step elements, and step s reads position
// position(L, reverse, s). Each address starts at its row's step 0 (a reversed head's rows at
// their own last position) and remembers the step its row ends at (its length where reversed:
// held steps read nothing worth fetching; else T), so that prefetch(s, ...) fetches step s of
// every row still running, forwards or backwards. One int a line more than L2Stream; the
// step's stride is the caller's (no registers held for it).
template <int kMax>
struct L2TimelineStream {
  const char* at[kMax > 0 ? kMax : 1];
  int end[kMax > 0 ? kMax : 1];

  template <typename E, typename Length>
  __device__ __forceinline__ void init(const E* p, long long outer_stride, int outer, long long inner_stride,
                                       int inner, int len, int tid, int nthreads, long long step, bool reverse, int T,
                                       const Length& length) {
    const int bytes = len * (int)sizeof(E), lines = (bytes + 127) / 128 + 1;
#pragma unroll
    for (int i = 0; i < kMax; ++i) {
      const int k = tid + i * nthreads, slice = k / lines, line = k % lines;
      at[i] = nullptr;
      end[i] = 0;
      if (k < outer * inner * lines && bytes > 0) {
        const int r = slice / inner, L = length(r);
        const E* s = p + r * outer_stride + (slice % inner) * inner_stride + (reverse ? (L - 1) * step : 0);
        at[i] = reinterpret_cast<const char*>(s) + (128 * line < bytes - 1 ? 128 * line : bytes - 1);
        end[i] = reverse ? L : T;
      }
    }
  }

  // Step s's lines (0 <= s) of the rows that run through step s; step_bytes: init's step in
  // bytes, negative in a reversed head.
  __device__ __forceinline__ void prefetch(int s, long long step_bytes) const {
#pragma unroll
    for (int i = 0; i < kMax; ++i)
      if (s < end[i]) asm volatile("prefetch.global.L2 [%0];" ::"l"(at[i] + s * step_bytes));
  }
};

// Bytes [p, p + bytes) into L2 by one bulk prefetch (sm_90's cp.async.bulk.prefetch: the copy
// engine fetches them, no register waits; p 16-byte aligned, bytes a multiple of 16). A
// no-op before sm_90.
__device__ __forceinline__ void prefetch_l2_bulk(const void* p, const unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

}  // namespace rnncc

namespace rnncc {

// Asynchronous copies global -> shared (cp.async): kBytes (4, 8 or 16; both addresses aligned
// to it) from src to the shared address dst, or kBytes zeros where `valid` is false (nothing
// is read then). Completion is counted in groups per thread: commit closes a group, and
// wait<N> returns once at most N of the thread's groups are still in flight; a barrier after
// it makes the copies visible to the other threads.
// An unsigned type of kBytes bytes (one access of that width).
template <int kBytes> struct Bytes;
template <> struct Bytes<2> { using type = unsigned short; };
template <> struct Bytes<4> { using type = unsigned int; };
template <> struct Bytes<8> { using type = uint2; };
template <> struct Bytes<16> { using type = uint4; };

template <int kBytes>
__device__ __forceinline__ void cp_async(unsigned dst, const void* src, bool valid) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "cp.async copies 4, 8 or 16 bytes");
  const int n = valid ? kBytes : 0;
  if constexpr (kBytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(n) : "memory");
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(dst), "l"(src), "n"(kBytes), "r"(n) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Bulk copies global -> shared through the copy engine (sm_90 and newer): bulk_copy issues one
// copy of `bytes` (a multiple of 16; both addresses 16-byte aligned), which counts them off the
// mbarrier at the shared address `bar` as they land; mbar_arrive_expect announces bytes on it
// (expect_tx) and arrives. A phase of the barrier ends once its arrivals are in and as many
// bytes have landed as were announced: the count may run below zero while copies land before
// their announcement, and the phase cannot end before the last arrival.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define RNNCC_BULK_COPY 1
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(arrivals) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // seen by the copy engine
}
__device__ __forceinline__ void mbar_arrive_expect(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  unsigned done = 0;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ __forceinline__ void bulk_copy(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
#else
#define RNNCC_BULK_COPY 0
#endif

}  // namespace rnncc

namespace rnncc {

// Two adjacent elements in one access (p must be aligned to twice the element size).
template <typename E> struct Pair;
template <> struct Pair<float> { typedef float2 type; };
template <> struct Pair<__half> { typedef __half2 type; };
template <> struct Pair<__nv_bfloat16> { typedef __nv_bfloat162 type; };

template <typename E>
__device__ __forceinline__ void load_pair(const E* p, E& lo, E& hi) {
  const typename Pair<E>::type v = *reinterpret_cast<const typename Pair<E>::type*>(p);
  lo = v.x;
  hi = v.y;
}

template <typename E>
__device__ __forceinline__ void store_pair(E* p, E lo, E hi) {
  typename Pair<E>::type v;
  v.x = lo;
  v.y = hi;
  *reinterpret_cast<typename Pair<E>::type*>(p) = v;
}

}  // namespace rnncc

namespace rnncc {

// The grid tier's exchange between the blocks of one head: values as their bits (16, or 32 for
// fp32: Operand<T>::Bits), written with ordinary stores, and a counter per batch chunk, to which
// each producing warp adds 1 with release semantics once its values of a step are out
// (xchg_count, after a __syncwarp: the release covers the whole warp's stores). A reader polls
// the counter with acquire loads until it reaches the step's target (xchg_wait), then a barrier,
// then the block loads the values: the acquire and the barrier order those loads after the
// producers' stores. Double-buffered by step parity, so a value is overwritten only after every
// block has read it (a block writes step s + 2 only after reading everybody's step s + 1, which
// each wrote after reading step s).
//
// Values travel without tags (32-bit words carrying a value and its step's tag, checked on
// every word, double the bytes a block takes in every step: benchmarks/exchange_bench.cu
// times both). Every poll is an L2 request to the counter's line, and more pollers lengthen
// the step: one polling thread per block, one counter per batch chunk.
template <typename T> __device__ __forceinline__ typename Operand<T>::Bits bits(T v);
template <> __device__ __forceinline__ unsigned short bits<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
template <> __device__ __forceinline__ unsigned short bits<__half>(__half v) { return __half_as_ushort(v); }
template <> __device__ __forceinline__ unsigned bits<float>(float v) { return __float_as_uint(v); }

template <typename T>
__device__ __forceinline__ void xchg_put(typename Operand<T>::Bits* p, T v) { *p = bits(v); }

// Two adjacent values; p is aligned to both.
template <typename T>
__device__ __forceinline__ void xchg_put2(typename Operand<T>::Bits* p, T lo, T hi) {
  if constexpr (sizeof(T) == 4)
    *reinterpret_cast<uint2*>(p) = make_uint2(bits(lo), bits(hi));
  else
    *reinterpret_cast<unsigned*>(p) = (unsigned)bits(lo) | ((unsigned)bits(hi) << 16);
}

__device__ __forceinline__ void xchg_count(unsigned* p) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(p) : "memory");
}

// Thread 0 polls the counter until it reaches `target`, the other threads wait at the barrier.
// (Spinning on the values themselves, every block on every word, floods the L2 slices that
// hold them.)
__device__ __forceinline__ void xchg_wait(const unsigned* counter, unsigned target) {
  if (threadIdx.x == 0) {
    unsigned v;
    do {
      asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
    } while (v < target);
  }
  __syncthreads();
}

// Where unit d of h sits in an exchange row published in fragment order: within each 32 units
// (a pair of k tiles of m16n8k16), the four values lane (g, c) of a warp needs as B fragments,
// units 2c, 2c + 1, 2c + 8, 2c + 9 of the first tile and then of the second, are 8 adjacent
// values at 8c, so that one 16-byte load fills b0, b1 of both tiles.
__device__ __forceinline__ int frag_pos(int d) {
  const int r = d & 15, c = (r & 7) >> 1;
  return (d & ~31) + 8 * c + 4 * ((d >> 4) & 1) + 2 * (r >> 3) + (r & 1);
}

// 16 bytes at p, through L2 only.
__device__ __forceinline__ uint4 ld_cg4(const void* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}

// The fragment registers of k tiles [kt0, kt0 + kKT) of one batch row published in fragment
// order, its pair of k tiles p at row + kPairStride p (b0, b1 of h; a0, a2 or a1, a3 of dg):
// 16-byte loads (fp32: two) when kt0 and kKT are even, else one 8-byte (fp32: 16-byte) load
// a tile; zero for a dead row and past kTiles tiles.
template <int kKT, int kTiles, int kPairStride, typename Bits, typename Reg>
__device__ __forceinline__ void load_fragments(const Bits* row, int kt0, int c, bool live, Reg (&b)[kKT][2]) {
  static_assert(sizeof(Reg) == 2 * sizeof(Bits), "a register holds two values");
  if constexpr (kKT % 2 == 0) {
    if (kt0 % 2 == 0) {
#pragma unroll
      for (int i = 0; i < kKT; i += 2) {
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if constexpr (sizeof(Bits) == 4) {
          uint4 w = v;
          if (live && kt0 + i < kTiles) {
            v = ld_cg4(row + kPairStride * ((kt0 + i) >> 1) + 8 * c);
            w = ld_cg4(row + kPairStride * ((kt0 + i) >> 1) + 8 * c + 4);
          }
          unduo(v, b[i][0], b[i][1]);
          unduo(w, b[i + 1][0], b[i + 1][1]);
        } else {  // (the load written out, not ld_cg4: that changed the 16-bit kernels' code)
          if (live && kt0 + i < kTiles)
            asm volatile("ld.global.cg.v4.b32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                         : "l"(row + kPairStride * ((kt0 + i) >> 1) + 8 * c)
                         : "memory");
          b[i][0] = v.x;
          b[i][1] = v.y;
          b[i + 1][0] = v.z;
          b[i + 1][1] = v.w;
        }
      }
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < kKT; ++i) {
    const int kt = kt0 + i;
    if constexpr (sizeof(Bits) == 4) {
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (live && kt < kTiles) v = ld_cg4(row + kPairStride * (kt >> 1) + 8 * c + 4 * (kt & 1));
      unduo(v, b[i][0], b[i][1]);
    } else {
      uint2 v = make_uint2(0u, 0u);
      if (live && kt < kTiles)
        asm volatile("ld.global.cg.v2.b32 {%0, %1}, [%2];"
                     : "=r"(v.x), "=r"(v.y)
                     : "l"(row + kPairStride * (kt >> 1) + 8 * c + 4 * (kt & 1))
                     : "memory");
      b[i][0] = v.x;
      b[i][1] = v.y;
    }
  }
}

// Makes `first` (the first register an mma reads of a group of fragments) depend on every
// register of `b`: `first ^= (b's bits or-ed) & zero`, where `zero` is 0 at run time but not
// to the compiler (rnncc::opaque_zero). The first mma then waits for all of the group's loads,
// so ptxas issues them together, one memory round trip; left to itself it may place a load
// right after the mma that read the previous load's registers (reusing them), a round trip each.
__device__ __forceinline__ uint32_t any_bits(const uint32_t r) { return r; }
__device__ __forceinline__ uint32_t any_bits(const uint2 r) { return r.x | r.y; }
template <int kKT, typename Reg>
__device__ __forceinline__ uint32_t or_all(const Reg (&b)[kKT][2]) {
  uint32_t v = 0u;
#pragma unroll
  for (int i = 0; i < kKT; ++i) v |= any_bits(b[i][0]) | any_bits(b[i][1]);
  return v;
}
__device__ __forceinline__ void join(uint32_t& first, const uint32_t all, const uint32_t zero) { first ^= all & zero; }
__device__ __forceinline__ void join(uint2& first, const uint32_t all, const uint32_t zero) { first.x ^= all & zero; }
// 0 for any valid batch size (B >= 0), which the compiler cannot know.
__device__ __forceinline__ uint32_t opaque_zero(const int B) { return (uint32_t)B >> 31; }

// a += b, component-wise.
__device__ __forceinline__ void add_to(float4& a, const float4& b) {
  a.x += b.x;
  a.y += b.y;
  a.z += b.z;
  a.w += b.w;
}
__device__ __forceinline__ void add_to(float2& a, const float2& b) {
  a.x += b.x;
  a.y += b.y;
}
__device__ __forceinline__ void add_to(float& a, const float& b) { a += b; }

// The sum of kN parts (float, float2 or float4) at p[0], p[stride], ... (a cell lane's slice of several
// warps' partial products in shared memory), loaded kChunk at a time, all of a chunk in flight,
// and added as a tree. A running sum over the parts, one load after the other, would make the
// grid forward's step wait on 6 (narrow blocks) or 12 (wide) dependent shared-memory round trips.
template <int kN, int kChunk, typename V>
__device__ __forceinline__ V sum_parts(const V* p, const int stride) {
  V s = {};
#pragma unroll
  for (int w0 = 0; w0 < kN; w0 += kChunk) {
    V v[kChunk];
#pragma unroll
    for (int w = 0; w < kChunk; ++w) v[w] = w0 + w < kN ? p[(w0 + w) * stride] : V{};
#pragma unroll
    for (int h = 1; h < kChunk; h *= 2)
#pragma unroll
      for (int w = 0; w + h < kChunk; w += 2 * h) add_to(v[w], v[w + h]);
    add_to(s, v[0]);
  }
  return s;
}

}  // namespace rnncc
