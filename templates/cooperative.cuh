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

// The persisting access-policy window that keeps part of `bytes` bytes from `base` in L2
// across a launch's steps (rnncc_launch.l2_bytes), on the device `dev`. The window is an
// attribute of each launch (nothing is set on the stream, and a captured graph keeps it in its
// kernel nodes); L2's set-aside for persisting lines is device state: raised once, outside
// stream capture, to what the window needs within the device's maximum, and kept (lines no
// window claims serve other accesses). The window's hit ratio makes its persisting lines
// `claim_permille` thousandths of the set-aside (the plan's, grid_mma's C::kFwL2Claim and
// kBwL2Claim): claiming all of it leaves the rest of the stream too little of L2. None
// (num_bytes 0) where the device keeps nothing.
inline cudaAccessPolicyWindow l2_window(void* base, const size_t bytes, const int dev, cudaStream_t stream,
                                        const int claim_permille) {
  static std::mutex lock;
  const std::lock_guard<std::mutex> hold(lock);
  cudaAccessPolicyWindow w = {};
  int max_set_aside = 0, max_window = 0;
  if (cudaDeviceGetAttribute(&max_set_aside, cudaDevAttrMaxPersistingL2CacheSize, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&max_window, cudaDevAttrMaxAccessPolicyWindowSize, dev) != cudaSuccess)
    return w;
  const size_t want = bytes < (size_t)max_window ? bytes : (size_t)max_window;
  size_t set_aside = 0;
  if (cudaDeviceGetLimit(&set_aside, cudaLimitPersistingL2CacheSize) != cudaSuccess) return w;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(stream, &capturing);
  if (set_aside < want && set_aside < (size_t)max_set_aside && capturing == cudaStreamCaptureStatusNone) {
    const size_t to = want < (size_t)max_set_aside ? want : (size_t)max_set_aside;
    if (cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, to) == cudaSuccess) set_aside = to;
  }
  if (set_aside == 0 || want == 0) return w;
  w.base_ptr = base;
  w.num_bytes = want;
  const double claim = 1e-3 * (double)claim_permille * (double)set_aside;
  w.hitRatio = claim >= (double)want ? 1.0f : (float)(claim / (double)want);
  w.hitProp = cudaAccessPropertyPersisting;
  w.missProp = cudaAccessPropertyStreaming;
  return w;
}

// The window's lines dropped from L2 after the launches that kept them, in stream order (so
// also in a captured graph): the whole 128-byte lines of [base, base + bytes), by
// discard.global.L2 (no write-back: the region is the streamed copy of R, which each launch
// writes before it reads it). Persisting lines stay until something evicts or resets them
// (CUDA's programming guide); left there, they would keep the set-aside (up to 37.5 MiB of an
// H100's 50 MB) from the process's other kernels.
template <int kThreads = 256>
__global__ void __launch_bounds__(kThreads) l2_release(char* base, const size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const size_t first = ((size_t)base + 127) / 128 * 128 - (size_t)base;
  const size_t stride = (size_t)gridDim.x * kThreads * 128;
  for (size_t at = first + ((size_t)blockIdx.x * kThreads + threadIdx.x) * 128; at + 128 <= bytes; at += stride)
    asm volatile("discard.global.L2 [%0], 128;" ::"l"(base + at) : "memory");
#endif
}

// Launch kernel `fn(a, n0, c0)` over NH heads and `chunks` batch chunks as `l` says, with
// `threads` threads and `smem` bytes of dynamic shared memory a block, and the L2 window of
// `l` over a's exchange buffer (its persisting lines `claim_permille` thousandths of the
// set-aside, all of it by default: l2_window), released after the launches (l2_release);
// `l.grid_x` is checked by the caller. A CUDA error code, or 0.
template <typename Args>
int launch_cooperative(void (*fn)(Args, int, int), const Args& a, const rnncc_launch& l, const int threads,
                       const size_t smem, const int chunks, SmemLimit& limit, cudaStream_t stream,
                       const int claim_permille = 1000) {
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
  if (l.l2_bytes < 0 || l.l2_from < 0 || (l.l2_bytes > 0 && a.xchg == nullptr)) return (int)cudaErrorInvalidValue;
  const cudaAccessPolicyWindow window =
      l.l2_bytes > 0 ? l2_window(a.xchg + l.l2_from, (size_t)l.l2_bytes, dev, stream, claim_permille) : cudaAccessPolicyWindow{};
  for (int n0 = 0; n0 < a.NH; n0 += l.grid_y) {
    for (int c0 = 0; c0 < chunks; c0 += l.grid_z) {
      const int nh = a.NH - n0 < l.grid_y ? a.NH - n0 : l.grid_y;
      const int nc = chunks - c0 < l.grid_z ? chunks - c0 : l.grid_z;
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3((unsigned)l.grid_x, (unsigned)nh, (unsigned)nc);
      cfg.blockDim = dim3((unsigned)threads);
      cfg.dynamicSmemBytes = smem;
      cfg.stream = stream;
      cudaLaunchAttribute attr[2];
      attr[0].id = cudaLaunchAttributeCooperative;
      attr[0].val.cooperative = 1;
      attr[1].id = cudaLaunchAttributeAccessPolicyWindow;
      attr[1].val.accessPolicyWindow = window;
      cfg.attrs = attr;
      cfg.numAttrs = window.num_bytes > 0 ? 2 : 1;
      err = cudaLaunchKernelEx(&cfg, fn, a, n0, c0);
      if (err != cudaSuccess) return (int)err;
    }
  }
  if (window.num_bytes > 0) {
    const size_t lines = window.num_bytes / 128;
    const unsigned blocks = (unsigned)(lines / 256 < 1024 ? lines / 256 + 1 : 1024);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(256);
    cfg.stream = stream;
    return (int)cudaLaunchKernelEx(&cfg, l2_release<256>, static_cast<char*>(window.base_ptr), window.num_bytes);
  }
  return 0;
}

}  // namespace rnncc
