// A batch row's steps (rnncc_abi.h: lengths, reverse): step t of a kernel's loop is live while
// t < L, the row's length, and reads and writes sequence position position(L, reverse, t),
// L - 1 - t in the reverse direction, else t; a held step past L writes zeros at position t.
#pragma once

namespace rnncc {

// Row `row`'s length: lengths[row], or T without lengths or for a row outside the batch
// (inside false: no length is read).
__device__ __forceinline__ int row_length(const int* lengths, const int T, const int row, const bool inside) {
  return lengths != nullptr && inside ? lengths[row] : T;
}

// Step t's position in a row of length L.
__device__ __forceinline__ int position(const int L, const int reverse, const int t) {
  return reverse && t < L ? L - 1 - t : t;
}

}  // namespace rnncc
