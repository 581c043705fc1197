// The grid_stream variant's kernels: grid_mma.cuh's, on blocks of 32 units (UW = 4) whose
// warps read the part of R their registers and shared memory do not hold from global memory
// each step (the traits' kFwSmemKT / kBwSmemKT leave the rest of a warp's k tiles there).
#pragma once
#include "grid_mma.cuh"

namespace rnncc {
namespace grid_stream {

using grid_mma::backward;
using grid_mma::forward;

}  // namespace grid_stream
}  // namespace rnncc
