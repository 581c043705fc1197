// A batch row's steps (rnncc_abi.h: lengths, reverse_from): step t of a kernel's loop is live
// while t < L, the row's length, and reads and writes sequence position position(L, rev, t),
// L - 1 - t in a reversed head (rev: reversed(a, head)), else t; a held step past L writes
// zeros at position t.
#pragma once

namespace rnncc {

// Row `row`'s length: lengths[row], or T without lengths or for a row outside the batch
// (inside false: no length is read).
__device__ __forceinline__ int row_length(const int* lengths, const int T, const int row, const bool inside) {
  return lengths != nullptr && inside ? lengths[row] : T;
}

// Whether head `head` runs in the reverse direction (a: any of rnncc_abi.h's argument structs).
template <typename Args>
__device__ __forceinline__ bool reversed(const Args& a, const int head) {
  return head >= a.reverse_from;
}

// Step t's position in a row of length L (rev: reversed(a, head)).
__device__ __forceinline__ int position(const int L, const bool reverse, const int t) {
  return reverse && t < L ? L - 1 - t : t;
}

// Where step t reads the row's inputs (W x): position(L, reverse, t) while t < L; a held step's
// go unused, and a reversed row's read its position 0, in L2 (its positions past L are not
// prefetched: reading them costs a step an HBM load).
__device__ __forceinline__ int read_position(const int L, const bool reverse, const int t) {
  return reverse ? (t < L ? L - 1 - t : 0) : t;
}

// A row's length L and direction in one int, where registers are short: -L in a reversed
// head, else L (L >= 1); abs() gives L back, signed_position the step's position.
__device__ __forceinline__ int signed_length(const int L, const bool reverse) { return reverse ? -L : L; }

__device__ __forceinline__ int signed_position(const int signed_L, const int t) {
  return position(abs(signed_L), signed_L < 0, t);
}

}  // namespace rnncc
