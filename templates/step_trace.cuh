// Where a grid step's time goes (benchmarks/step_phases.py builds the library with
// -DRNNCC_STEP_TRACE; nothing of this is compiled otherwise). Thread 0 of each block adds the
// clock cycles between consecutive marks of steps [kTraceFrom, kTraceTo) into shared memory
// (phase i ends at mark i, i = 1..8; mark 0 starts a step), and blocks 0, x / 2 and x - 1 of the
// first head and chunk print the mean of each phase when the sequence ends:
// "rnncc-step-trace fw|bw A B x y z: cycles of phases 1..8", A and B two numbers the kernel
// names (grid_mma: its n tiles and unit tiles). A phase marked more than once a step (grid_mma's
// two parts of n tiles, grid_sparse's chunks of the operand) adds up each part's time. The
// kernel's step counter must be named t.
#pragma once

#ifdef RNNCC_STEP_TRACE
#include <cstdio>
#define RNNCC_TRACE_INIT                              \
  __shared__ long long rnncc_trace[10];               \
  if (threadIdx.x < 10) rnncc_trace[threadIdx.x] = 0; \
  __syncthreads();
#define RNNCC_TRACE(i)                                                     \
  if (threadIdx.x == 0 && t >= rnncc::kTraceFrom && t < rnncc::kTraceTo) { \
    const long long now = clock64();                                       \
    if ((i) > 0) rnncc_trace[(i)] += now - rnncc_trace[9];                 \
    rnncc_trace[9] = now;                                                  \
  }
#define RNNCC_TRACE_PRINT(kind, A, B)                                                                                  \
  if (threadIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 &&                                                       \
      (blockIdx.x == 0 || blockIdx.x == gridDim.x / 2 || blockIdx.x == gridDim.x - 1)) {                               \
    const long long n = rnncc::kTraceTo - rnncc::kTraceFrom;                                                           \
    printf("rnncc-step-trace %s %d %d %d %d %d: %lld %lld %lld %lld %lld %lld %lld %lld\n", kind, (int)(A), (int)(B), \
           blockIdx.x, blockIdx.y, blockIdx.z, rnncc_trace[1] / n, rnncc_trace[2] / n, rnncc_trace[3] / n,             \
           rnncc_trace[4] / n, rnncc_trace[5] / n, rnncc_trace[6] / n, rnncc_trace[7] / n, rnncc_trace[8] / n);        \
  }
namespace rnncc {
constexpr int kTraceFrom = 100, kTraceTo = 900;  // the steps traced: a sequence of at least 900
}
#else
#define RNNCC_TRACE_INIT
#define RNNCC_TRACE(i)
#define RNNCC_TRACE_PRINT(kind, A, B)
#endif
