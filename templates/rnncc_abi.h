// The ABI between rnncc's generic host loop (stepwise_host.cpp, built once) and a cell's
// generated kernels (one small torch-free library per cell). Plain C: both sides are built
// separately, possibly by different compilers. Bump RNNCC_ABI_VERSION on any change.
//
// Layouts (float32 internal buffers are head-major so R·h is one batched matmul per step):
//   Wx, dWx   [B, T, Gx, NH, D]  storage dtype         y, dy   [O, B, T, NH, D] storage
//   bias      [Gb, NH, D]        storage               params  [P, NH, D]       storage
//   s_*, ds_* [S, NH, B, D]      float32               Rh      [NH, B, Gr * D]  float32
//   dGr       [NH, B, Gr * D]    float32               dGb     [NH, B, Gb * D]  float32
//   dP        [NH, B, P * D]     float32
//
// Every kernel runs T steps. With `lengths` (int32 [B], each in 1..T; null: all T) and
// `reverse_from` (0..NH: heads h >= reverse_from run in the reverse direction; NH: none, 0:
// all), step t of batch row b with L = lengths[b] is live while t < L and, in head h, reads
// and writes sequence position pos = h >= reverse_from ? L - 1 - t : t (of Wx, y and their
// cotangents); a step past L holds the row's states (the backward passes their cotangents
// through), writes 0 to y (and dWx) at position t and nothing else. Per-step buffers (Rh,
// hist, rh, dGr) stay indexed by the step t.
#pragma once
#include <cuda_runtime.h>

#define RNNCC_ABI_VERSION 12

enum rnncc_dtype { RNNCC_F32 = 0, RNNCC_F16 = 1, RNNCC_BF16 = 2 };

typedef struct rnncc_step_args {
  int B, T, NH, D;  // sizes
  int t;            // the step
  int dtype;        // rnncc_dtype of the storage tensors
  const int* lengths;  // per batch row, or null (above)
  int reverse_from;  // the first reversed head (above)
  // forward and backward inputs
  const void* Wx;
  const float* Rh;
  const void* bias;
  const void* params;
  const float* s_old;
  // forward outputs
  float* s_new;
  void* y;
  // backward inputs
  const float* ds_new;
  const void* dy;
  // backward outputs
  float* ds_old;
  void* dWx;
  float* dGr;
  float* dGb;
  float* dP;
} rnncc_step_args;

// A launcher: enqueues one step on `stream`; returns a cudaError_t (0: success).
typedef int (*rnncc_step_fn)(const rnncc_step_args* args, cudaStream_t stream);

// One decoding step (rnncc_decode, decode.cuh): y and the new states of one step, R·h and the
// cell in one launch, from states and either x with the input projection (W x + Wb) or Wx;
// for inference: no lengths, nothing saved. Storage dtype everywhere, float32 math.
// states_stride / new_states_stride: elements between state k and k + 1 (B·NH·D when
// contiguous; a layer's slice of a stack's [S, L, B, H] states otherwise). new_states must
// not overlap states: every block reads all of a head's h.
typedef struct rnncc_decode_args {
  int B, NH, D, I;  // I: the features of x (0 when Wx is given)
  int dtype;
  const void* x;       // [B, I], or null: Wx given
  const void* W;       // [Gx, NH, D, I] (an nn.Linear's weight), with x
  const void* Wb;      // [Gx, NH, D], or null
  const void* Wx;      // [B, Gx, NH, D], without x
  const void* R;       // [Gr, NH, D, D]
  const void* bias;    // [Gb, NH, D]
  const void* params;  // [P, NH, D]
  const void* states;  // [S, B, NH, D] (strided as above)
  long long states_stride;
  void* y;             // [O, B, NH, D], or null (the outputs are states: read new_states)
  void* new_states;    // [S, B, NH, D] (strided as above)
  long long new_states_stride;
  int weights_first;   // nonzero: the kernel before this one on the stream writes neither W
                       // nor R (the layer below's step), so they are read before waiting for it
} rnncc_decode_args;

typedef int (*rnncc_decode_fn)(const rnncc_decode_args* args, cudaStream_t stream);

// How a fused kernel is launched, from the plan (rnncc.variants): which of the library's
// kernels, its threads and dynamic shared memory per block, and the blocks of one launch.
// The library checks the numbers against the ones it was built with. Passed beside the
// kernels' arguments, not in them: the kernels take those by value.
typedef struct rnncc_launch {
  int kernel, threads, smem;
  int grid_x, grid_y, grid_z;
  int l2_from, l2_bytes;  // the exchange buffer's l2_bytes bytes from its word l2_from: kept in
                          // L2 (a persisting access-policy window on each launch; 0: none)
} rnncc_launch;

// The fused forward: the whole sequence in one launch (rnncc_fused_forward). Layouts as
// above, plus: states, last [S, B, NH, D] storage; R [Gr, NH, D, D] storage (out x in);
// hist [T + 1, S, NH, B, D] float32 and rh [T, NH, B, Gr * D] float32, both written only
// when not null (they are what the backward reads); xchg: zeros, the grid tier's exchange
// between the blocks of a head: values of the storage dtype's width [2, NH, B8, xchg_words]
// (B8: B rounded up to a multiple of 8; the kernels order each slot in blocks of 8 rows),
// then uint32 counters
// [NH, B8 / 8] (xchg_words from the plan, a multiple of 32; 0 and null for the block tier),
// then, from the next multiple of 4 words, the part of R that a streaming kernel reads from
// memory each step (sized by the plan; the kernels write it before reading it).
typedef struct rnncc_fused_args {
  int B, T, NH, D;
  int dtype;
  const int* lengths;  // per batch row, or null (above); only kernels built with C::kTimeline read them
  int reverse_from;  // the first reversed head (above)
  const void* Wx;
  const void* R;
  const void* bias;
  const void* params;
  const void* states;
  void* y;
  void* last;
  float* hist;
  float* rh;
  unsigned int* xchg;
  int xchg_words;
} rnncc_fused_args;

typedef int (*rnncc_fused_fn)(const rnncc_fused_args* args, const rnncc_launch* launch, cudaStream_t stream);

// The fused backward (rnncc_fused_backward): the whole reverse sequence in one launch. Reads
// hist and rh as the fused forward wrote them, dy [O, B, T, NH, D] and dlast [S, B, NH, D]
// (storage); writes dWx (storage), dstates [S, B, NH, D] (storage), the gate cotangents of
// every step dGr [NH, T, B, Gr * D] (storage dtype, head-major: the operand of the host's dR
// GEMM as it is), and the bias and param cotangents summed over time, dGb [B, NH, Gb * D]
// and dP [B, NH, P * D] (float32), which the host sums over the batch. xchg as in the
// forward (zeroed again).
typedef struct rnncc_fused_bwd_args {
  int B, T, NH, D;
  int dtype;
  const int* lengths;  // as in the forward
  int reverse_from;  // the first reversed head (above)
  const void* Wx;
  const void* R;
  const void* bias;
  const void* params;
  const float* hist;
  const float* rh;
  const void* dy;
  const void* dlast;
  void* dWx;
  void* dstates;
  void* dGr;
  float* dGb;
  float* dP;
  unsigned int* xchg;
  int xchg_words;
} rnncc_fused_bwd_args;

typedef int (*rnncc_fused_bwd_fn)(const rnncc_fused_bwd_args* args, const rnncc_launch* launch,
                                  cudaStream_t stream);
