// Cooperative launches of the grid variants (grid_mma, grid_stream, grid_sparse): a kernel
// whose blocks of a (head, batch chunk) wait on each other, so all blocks of one launch must be
// resident at once. The plan (the variant's `launch`) sizes a launch to the SMs: grid_x blocks
// per head, grid_y heads and grid_z batch chunks per launch; the (head, chunk) pairs beyond run
// in further launches, one after the other on the stream.
#pragma once
#include <mutex>

#include "rnncc_abi.h"

namespace rnncc {

constexpr int kSmemDevices = 64;  // devices whose shared memory limits are raised once and kept

// The shared memory limit of one kernel, raised once per device (the opt-in beyond 48 KiB).
struct SmemLimit {
  std::mutex lock;
  bool raised[kSmemDevices] = {};
};

// Launch kernel `fn(a, n0, c0)` over NH heads and `chunks` batch chunks as `l` says, with
// `threads` threads and `smem` bytes of dynamic shared memory a block; `l.grid_x` is checked by
// the caller. A CUDA error code, or 0.
template <typename Args>
int launch_cooperative(void (*fn)(Args, int, int), const Args& a, const rnncc_launch& l, const int threads,
                       const size_t smem, const int chunks, SmemLimit& limit, cudaStream_t stream) {
  if (l.threads != threads || (size_t)l.smem != smem || l.grid_y < 1 || l.grid_z < 1 || l.grid_z > chunks)
    return (int)cudaErrorInvalidValue;
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return (int)err;
  {
    const std::lock_guard<std::mutex> hold(limit.lock);
    if (dev >= kSmemDevices || !limit.raised[dev]) {
      err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
      if (err != cudaSuccess) return (int)err;
      if (dev < kSmemDevices) limit.raised[dev] = true;
    }
  }
  for (int n0 = 0; n0 < a.NH; n0 += l.grid_y) {
    for (int c0 = 0; c0 < chunks; c0 += l.grid_z) {
      const int nh = a.NH - n0 < l.grid_y ? a.NH - n0 : l.grid_y;
      const int nc = chunks - c0 < l.grid_z ? chunks - c0 : l.grid_z;
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3((unsigned)l.grid_x, (unsigned)nh, (unsigned)nc);
      cfg.blockDim = dim3((unsigned)threads);
      cfg.dynamicSmemBytes = smem;
      cfg.stream = stream;
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeCooperative;
      attr[0].val.cooperative = 1;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      err = cudaLaunchKernelEx(&cfg, fn, a, n0, c0);
      if (err != cudaSuccess) return (int)err;
    }
  }
  return 0;
}

}  // namespace rnncc
