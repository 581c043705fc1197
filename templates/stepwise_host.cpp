// rnncc stepwise backend: the generic host loop, shared by every cell and built once per
// torch/CUDA installation. A cell's generated kernels live in their own torch-free library
// and are called through the function pointers and the struct of rnncc_abi.h.
//
// Forward, per step t: Rh = R·h[t-1] as one batched matmul over heads (float32, ATen), then
// the cell's pointwise kernel. Backward, per step from the last: the cell's backward kernel,
// then the recurrent state's cotangent += Rᵀ·dg. After the loop dR = Σ_t dgᵀ h[t-1] is one
// einsum (a batched GEMM), db and dparams one reduction each. No host synchronisation: the
// loop only enqueues work on the current stream, so it can be captured in a CUDA graph.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "rnncc_abi.h"

namespace {

// The cell's sizes: [S, O, Gx, Gr, Gb, P, recurrent state's index].
struct Dims {
  int64_t S, O, Gx, Gr, Gb, P, rec;
  explicit Dims(at::IntArrayRef d) {
    TORCH_CHECK(d.size() == 7, "rnncc: dims must be [S, O, Gx, Gr, Gb, P, rec]");
    S = d[0]; O = d[1]; Gx = d[2]; Gr = d[3]; Gb = d[4]; P = d[5]; rec = d[6];
  }
};

// A fused call's launch, from the plan (rnncc.variants' Launch.as_list): the grid tier's
// exchange values per (head, batch row) and the 32-bit words of its buffer (0, 0 for the
// block tier), the part of it kept in L2 (its first word and bytes; 0, 0: none), then the
// forward's and the backward's rnncc_launch.
struct Plan {
  int64_t X, words;
  rnncc_launch fw, bw;
  explicit Plan(at::IntArrayRef l) {
    TORCH_CHECK(l.size() == 16,
                "rnncc: a fused launch is [X, words, L2 window's word and bytes, forward (6), backward (6)]");
    X = l[0]; words = l[1];
    const int from = (int)l[2], bytes = (int)l[3];
    fw = rnncc_launch{(int)l[4], (int)l[5], (int)l[6], (int)l[7], (int)l[8], (int)l[9], from, bytes};
    bw = rnncc_launch{(int)l[10], (int)l[11], (int)l[12], (int)l[13], (int)l[14], (int)l[15], from, bytes};
  }
};

// The grid tier's exchange buffer (rnncc_abi.h; the kernels find their part of it with
// fused_grid.cuh.j2's Exchange), of the plan's size, zeroed on `stream` (the counters start
// at 0, and the padding values, never written, must be finite) by a memset rather than a fill
// kernel, whose launch costs the call more host time; set in the launch arguments `a` (a
// fused_args or fused_bwd_args); undefined, with a's fields null and 0, when the kernels take
// none.
template <typename Args>
at::Tensor attach_exchange(Args& a, const Plan& p, const at::Tensor& like, cudaStream_t stream) {
  at::Tensor xchg = p.words ? at::empty({p.words}, like.options().dtype(at::kInt)) : at::Tensor();
  if (p.words) C10_CUDA_CHECK(cudaMemsetAsync(xchg.data_ptr(), 0, xchg.nbytes(), stream));
  a.xchg = p.words ? reinterpret_cast<unsigned int*>(xchg.data_ptr<int>()) : nullptr;
  a.xchg_words = static_cast<int>(p.X);
  return xchg;
}

int dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return RNNCC_F32;
    case at::kHalf: return RNNCC_F16;
    case at::kBFloat16: return RNNCC_BF16;
    default: TORCH_CHECK(false, "rnncc stepwise: unsupported storage dtype ", t);
  }
  return -1;
}

const void* cptr(const at::Tensor& t) { return t.defined() && t.numel() ? t.data_ptr() : nullptr; }
void* mptr(const at::Tensor& t) { return t.defined() && t.numel() ? t.data_ptr() : nullptr; }
const float* cfptr(const at::Tensor& t) {
  return t.defined() && t.numel() ? t.data_ptr<float>() : nullptr;
}
float* fptr(const at::Tensor& t) { return t.defined() && t.numel() ? t.data_ptr<float>() : nullptr; }

at::Tensor opt(const c10::optional<at::Tensor>& t) { return t.has_value() ? t->contiguous() : at::Tensor(); }

// The per-row lengths and the directions into a kernel's arguments (rnncc_abi.h): lengths int32
// [B] on the device of Wx (the Python side converts them), or none; heads reverse_from.. reversed.
template <typename Args>
void set_timeline(Args& a, const c10::optional<at::Tensor>& lengths, int64_t reverse_from, const at::Tensor& Wx) {
  a.lengths = nullptr;
  if (lengths.has_value()) {
    const at::Tensor& l = *lengths;
    TORCH_CHECK(l.scalar_type() == at::kInt && l.dim() == 1 && l.size(0) == Wx.size(0) && l.is_contiguous() &&
                    l.device() == Wx.device(),
                "rnncc: lengths must be a contiguous int32 [B] tensor on the device of Wx");
    a.lengths = l.data_ptr<int>();
  }
  TORCH_CHECK(reverse_from >= 0 && reverse_from <= Wx.size(3), "rnncc: reverse_from ", reverse_from,
              " is not a head index in 0..", Wx.size(3));
  a.reverse_from = static_cast<int>(reverse_from);
}

void launch(int64_t fn, const rnncc_step_args& a, cudaStream_t stream, const char* what) {
  const int err = reinterpret_cast<rnncc_step_fn>(fn)(&a, stream);
  TORCH_CHECK(err == 0, "rnncc stepwise: launching the ", what, " kernel failed: ",
              cudaGetErrorString(static_cast<cudaError_t>(err)));
}

void poison(at::Tensor& t) {
  if (t.defined() && t.numel()) t.fill_(std::numeric_limits<float>::quiet_NaN());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> stepwise_forward(
    const at::Tensor& Wx_, const c10::optional<at::Tensor>& R_, const c10::optional<at::Tensor>& b_,
    const at::Tensor& states, const c10::optional<at::Tensor>& params_,
    const c10::optional<at::Tensor>& lengths, int64_t reverse_from, int64_t fn, at::IntArrayRef dims, bool save,
    bool poison_outputs) {
  const Dims k(dims);
  c10::cuda::CUDAGuard guard(Wx_.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor Wx = Wx_.contiguous(), bias = opt(b_), params = opt(params_);
  const int64_t B = Wx.size(0), T = Wx.size(1), NH = Wx.size(3), D = Wx.size(4);
  const auto f32 = Wx.options().dtype(at::kFloat);

  // Internal states are [S, NH, B, D] float32: head-major, so R·h is one bmm per step.
  at::Tensor hist = at::empty({save ? T + 1 : 2, k.S, NH, B, D}, f32);
  if (poison_outputs) poison(hist);
  hist[0].copy_(states.permute({0, 2, 1, 3}));
  at::Tensor RT, rh;
  if (k.Gr) {
    RT = R_->permute({1, 3, 0, 2}).reshape({NH, D, k.Gr * D}).to(at::kFloat).contiguous();
    rh = at::empty({save ? T : 1, NH, B, k.Gr * D}, f32);
    if (poison_outputs) poison(rh);
  }
  at::Tensor y = at::empty({k.O, B, T, NH, D}, Wx.options());
  if (poison_outputs) poison(y);

  rnncc_step_args a{};
  a.B = B; a.T = T; a.NH = NH; a.D = D;
  a.dtype = dtype_code(Wx.scalar_type());
  a.Wx = cptr(Wx); a.bias = cptr(bias); a.params = cptr(params); a.y = mptr(y);
  set_timeline(a, lengths, reverse_from, Wx);
  for (int64_t t = 0; t < T; ++t) {
    at::Tensor s_old = hist[save ? t : t % 2], s_new = hist[save ? t + 1 : (t + 1) % 2];
    if (k.Gr) {
      at::Tensor out = rh[save ? t : 0];
      at::bmm_out(out, s_old[k.rec], RT);
      a.Rh = cfptr(out);
    }
    a.t = static_cast<int>(t);
    a.s_old = cfptr(s_old);
    a.s_new = fptr(s_new);
    launch(fn, a, stream, "forward");
  }
  // Fresh outputs: a custom op's results must not alias each other or its inputs, and a
  // permuted view with a unit dimension can already be contiguous.
  at::Tensor last = at::empty({k.S, B, NH, D}, Wx.options());
  last.copy_(hist[save ? T : T % 2].permute({0, 2, 1, 3}));
  if (!save) {
    hist = at::empty({0}, f32);
    rh = at::empty({0}, f32);
  } else if (!k.Gr) {
    rh = at::empty({0}, f32);
  }
  return {y, last, hist, rh};
}

using Grads = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// t with the strides of a new contiguous tensor of its shape, copying only when its elements
// are not in that order. contiguous() alone keeps the stride of a size-1 dim (NH = 1 after a
// permute), and a gradient whose strides differ from its parameter's costs DDP a copy per
// step (and a warning).
at::Tensor packed(const at::Tensor& t) { return t.contiguous().view({-1}).view(t.sizes()); }

// dR = Σ_t dgᵀ h[t-1] as one batched GEMM (one per head) from G, the gate cotangents
// [NH, T, B, Gr * D] in the storage type (rounded to it, with fp32 accumulation, as cuDNN
// does: half the bytes, and the GEMM runs on the tensor cores), and the saved states `hist`.
// Per head, dR = Gᵀ H over the T·B rows; h[t - 1] copied once to head-major [NH, T, B, D] in
// the storage type (rows stay contiguous, so the copy streams), the transpose left to the GEMM.
at::Tensor r_gradient(const at::Tensor& G, const at::Tensor& hist, at::IntArrayRef dims) {
  const Dims k(dims);
  c10::cuda::CUDAGuard guard(G.device());
  const int64_t NH = G.size(0), T = G.size(1), B = hist.size(3), D = hist.size(4);
  at::Tensor H = at::empty({NH, T, B, D}, G.options());
  H.copy_(hist.narrow(0, 0, T).select(1, k.rec).permute({1, 0, 2, 3}));
  return packed(at::bmm(G.view({NH, T * B, k.Gr * D}).transpose(1, 2), H.view({NH, T * B, D}))
                    .view({NH, k.Gr, D, D}).permute({1, 0, 2, 3}).to(G.scalar_type()));
}

// After a backward loop: dR (r_gradient; `defer_dR`: G itself, for the caller to make dR
// elsewhere, as rnncc.RNN does on a second stream); db and dparams as one sum each of dGb / dP
// over the dims `rows`, which leave [NH, G * D]; returns (dWx, dR, db, dstates, dparams).
Grads weight_gradients(const Dims& k, const at::Tensor& Wx, const at::Tensor& hist,
                       const at::Tensor& G, const at::Tensor& dGb, const at::Tensor& dP,
                       at::IntArrayRef rows, const at::Tensor& dWx, const at::Tensor& dstates,
                       at::IntArrayRef dims, bool defer_dR) {
  const int64_t NH = Wx.size(3), D = Wx.size(4);
  const auto dtype = Wx.scalar_type();
  at::Tensor dR = at::empty({0}, Wx.options()), db = at::empty({0}, Wx.options()),
             dparams = at::empty({0}, Wx.options());
  if (k.Gr) dR = defer_dR ? G : r_gradient(G, hist, dims);
  if (k.Gb) db = packed(dGb.sum(at::OptionalIntArrayRef(rows)).view({NH, k.Gb, D}).permute({1, 0, 2}).to(dtype));
  if (k.P) dparams = packed(dP.sum(at::OptionalIntArrayRef(rows)).view({NH, k.P, D}).permute({1, 0, 2}).to(dtype));
  return {dWx, dR, db, dstates, dparams};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> stepwise_backward(
    const at::Tensor& dy_, const at::Tensor& dlast, const at::Tensor& Wx_,
    const c10::optional<at::Tensor>& R_, const c10::optional<at::Tensor>& b_,
    const c10::optional<at::Tensor>& params_, const c10::optional<at::Tensor>& lengths, int64_t reverse_from,
    const at::Tensor& hist, const at::Tensor& rh, int64_t fn, at::IntArrayRef dims, bool poison_outputs,
    bool defer_dR) {
  const Dims k(dims);
  c10::cuda::CUDAGuard guard(Wx_.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor Wx = Wx_.contiguous(), dy = dy_.contiguous(), bias = opt(b_), params = opt(params_);
  const int64_t B = Wx.size(0), T = Wx.size(1), NH = Wx.size(3), D = Wx.size(4);
  const auto f32 = Wx.options().dtype(at::kFloat);

  at::Tensor ds = at::empty({2, k.S, NH, B, D}, f32);
  if (poison_outputs) poison(ds);
  ds[0].copy_(dlast.permute({0, 2, 1, 3}));
  at::Tensor dWx = at::empty_like(Wx);
  if (poison_outputs) poison(dWx);
  at::Tensor dGr = k.Gr ? at::empty({T, NH, B, k.Gr * D}, f32) : at::Tensor();
  at::Tensor dGb = k.Gb ? at::empty({T, NH, B, k.Gb * D}, f32) : at::Tensor();
  at::Tensor dP = k.P ? at::empty({T, NH, B, k.P * D}, f32) : at::Tensor();
  if (poison_outputs) { poison(dGr); poison(dGb); poison(dP); }
  at::Tensor Rn;
  if (k.Gr) Rn = R_->permute({1, 0, 2, 3}).reshape({NH, k.Gr * D, D}).to(at::kFloat).contiguous();

  rnncc_step_args a{};
  a.B = B; a.T = T; a.NH = NH; a.D = D;
  a.dtype = dtype_code(Wx.scalar_type());
  a.Wx = cptr(Wx); a.bias = cptr(bias); a.params = cptr(params);
  a.dy = cptr(dy); a.dWx = mptr(dWx);
  set_timeline(a, lengths, reverse_from, Wx);
  int cur = 0;
  for (int64_t t = T - 1; t >= 0; --t) {
    a.t = static_cast<int>(t);
    a.s_old = cfptr(hist[t]);
    a.Rh = k.Gr ? cfptr(rh[t]) : nullptr;
    a.ds_new = cfptr(ds[cur]);
    a.ds_old = fptr(ds[1 - cur]);
    a.dGr = k.Gr ? fptr(dGr[t]) : nullptr;
    a.dGb = k.Gb ? fptr(dGb[t]) : nullptr;
    a.dP = k.P ? fptr(dP[t]) : nullptr;
    launch(fn, a, stream, "backward");
    if (k.Gr) ds[1 - cur][k.rec].baddbmm_(dGr[t], Rn);  // the path through R: += Rᵀ·dg
    cur = 1 - cur;
  }
  at::Tensor dstates = at::empty({k.S, B, NH, D}, Wx.options());
  dstates.copy_(ds[cur].permute({0, 2, 1, 3}));
  at::Tensor G;
  if (k.Gr) {
    G = at::empty({NH, T, B, k.Gr * D}, Wx.options());
    G.copy_(dGr.permute({1, 0, 2, 3}));
  }
  const std::vector<int64_t> time_and_batch{0, 2};  // of [T, NH, B, ·]
  return weight_gradients(k, Wx, hist, G, dGb, dP, time_and_batch, dWx, dstates, dims, defer_dR);
}

// What a failed fused launch most likely means, for the error message.
std::string fused_hint(int err) {
  if (err == cudaErrorInvalidValue)
    return " (the launch does not match the library's kernels: a plan from another version?)";
  if (err != cudaErrorCooperativeLaunchTooLarge) return "";
  return " (the plan's blocks are not all resident at once on this GPU: another process or a "
         "MIG slice may hold SMs; use backend='stepwise')";
}

// A contiguous tensor whose data starts 16-byte aligned (the fused kernels read adjacent
// elements as one access): a view that starts mid-way is copied.
at::Tensor aligned_contiguous(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 == 0 ? c : c.clone();
}

// The fused forward: one launch for the whole sequence; outputs laid out as stepwise_forward's
// (hist and rh only when save), so stepwise_backward serves as its backward.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> fused_forward(
    const at::Tensor& Wx_, const c10::optional<at::Tensor>& R_, const c10::optional<at::Tensor>& b_,
    const at::Tensor& states_, const c10::optional<at::Tensor>& params_,
    const c10::optional<at::Tensor>& lengths, int64_t reverse_from, int64_t fn, at::IntArrayRef dims,
    at::IntArrayRef launch, bool save, bool poison_outputs) {
  const Dims k(dims);
  const Plan plan(launch);
  c10::cuda::CUDAGuard guard(Wx_.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor Wx = aligned_contiguous(Wx_), R = opt(R_), bias = opt(b_), params = opt(params_);
  const at::Tensor states = states_.contiguous();
  const int64_t B = Wx.size(0), T = Wx.size(1), NH = Wx.size(3), D = Wx.size(4);
  const auto f32 = Wx.options().dtype(at::kFloat);
  at::Tensor y = at::empty({k.O, B, T, NH, D}, Wx.options());
  at::Tensor last = at::empty({k.S, B, NH, D}, Wx.options());
  at::Tensor hist = save ? at::empty({T + 1, k.S, NH, B, D}, f32) : at::empty({0}, f32);
  at::Tensor rh = save && k.Gr ? at::empty({T, NH, B, k.Gr * D}, f32) : at::empty({0}, f32);
  if (poison_outputs) {
    poison(y);
    poison(last);
    poison(hist);
    poison(rh);
  }
  rnncc_fused_args a{};
  a.B = B; a.T = T; a.NH = NH; a.D = D;
  a.dtype = dtype_code(Wx.scalar_type());
  a.Wx = cptr(Wx); a.R = cptr(R); a.bias = cptr(bias); a.params = cptr(params);
  a.states = cptr(states);
  a.y = mptr(y); a.last = mptr(last);
  a.hist = save ? fptr(hist) : nullptr;
  a.rh = save && k.Gr ? fptr(rh) : nullptr;
  set_timeline(a, lengths, reverse_from, Wx);
  const at::Tensor xchg = attach_exchange(a, plan, Wx, stream);  // alive until the launch is queued
  const int err = reinterpret_cast<rnncc_fused_fn>(fn)(&a, &plan.fw, stream);
  TORCH_CHECK(err == 0, "rnncc fused: launching the forward kernel failed: ",
              cudaGetErrorString(static_cast<cudaError_t>(err)), fused_hint(err));
  return {y, last, hist, rh};
}

// The fused backward: one launch for the whole reverse sequence, then the same weight
// gradients as stepwise_backward.
Grads fused_backward(const at::Tensor& dy_, const at::Tensor& dlast_, const at::Tensor& Wx_,
                     const c10::optional<at::Tensor>& R_, const c10::optional<at::Tensor>& b_,
                     const c10::optional<at::Tensor>& params_, const c10::optional<at::Tensor>& lengths,
                     int64_t reverse_from, const at::Tensor& hist, const at::Tensor& rh, int64_t fn,
                     at::IntArrayRef dims, at::IntArrayRef launch, bool poison_outputs, bool defer_dR) {
  const Dims k(dims);
  const Plan plan(launch);
  c10::cuda::CUDAGuard guard(Wx_.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor Wx = aligned_contiguous(Wx_), dy = aligned_contiguous(dy_);
  const at::Tensor dlast = dlast_.contiguous();
  const at::Tensor R = opt(R_), bias = opt(b_), params = opt(params_);
  const int64_t B = Wx.size(0), T = Wx.size(1), NH = Wx.size(3), D = Wx.size(4);
  const auto f32 = Wx.options().dtype(at::kFloat);
  at::Tensor dWx = at::empty_like(Wx);
  at::Tensor dstates = at::empty({k.S, B, NH, D}, Wx.options());
  at::Tensor dGr = k.Gr ? at::empty({NH, T, B, k.Gr * D}, Wx.options()) : at::Tensor();
  at::Tensor dGb = k.Gb ? at::empty({B, NH, k.Gb * D}, f32) : at::Tensor();  // summed over time
  at::Tensor dP = k.P ? at::empty({B, NH, k.P * D}, f32) : at::Tensor();
  if (poison_outputs) {
    poison(dWx); poison(dstates); poison(dGr); poison(dGb); poison(dP);
  }
  rnncc_fused_bwd_args a{};
  a.B = B; a.T = T; a.NH = NH; a.D = D;
  a.dtype = dtype_code(Wx.scalar_type());
  a.Wx = cptr(Wx); a.R = cptr(R); a.bias = cptr(bias); a.params = cptr(params);
  a.hist = cfptr(hist); a.rh = k.Gr ? cfptr(rh) : nullptr;
  a.dy = cptr(dy); a.dlast = cptr(dlast);
  a.dWx = mptr(dWx); a.dstates = mptr(dstates);
  a.dGr = k.Gr ? mptr(dGr) : nullptr;
  a.dGb = k.Gb ? fptr(dGb) : nullptr;
  a.dP = k.P ? fptr(dP) : nullptr;
  set_timeline(a, lengths, reverse_from, Wx);
  const at::Tensor xchg = attach_exchange(a, plan, Wx, stream);  // alive until the launch is queued
  const int err = reinterpret_cast<rnncc_fused_bwd_fn>(fn)(&a, &plan.bw, stream);
  TORCH_CHECK(err == 0, "rnncc fused: launching the backward kernel failed: ",
              cudaGetErrorString(static_cast<cudaError_t>(err)), fused_hint(err));
  const std::vector<int64_t> batch{0};  // of [B, NH, ·]
  return weight_gradients(k, Wx, hist, dGr, dGb, dP, batch, dWx, dstates, dims, defer_dR);
}

// Whether t is a [S, B, NH, D] view whose (B, NH, D) part is contiguous (the states strided
// or not): the layout the decoding kernel reads and writes.
bool states_view(const at::Tensor& t) {
  return t.dim() == 4 && t.stride(3) == 1 && t.stride(2) == t.size(3) && t.stride(1) == t.size(2) * t.size(3);
}

// Whether the bytes of two tensors' spans (first to last element) overlap.
bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  if (!a.defined() || !b.defined() || !a.numel() || !b.numel()) return false;
  auto span = [](const at::Tensor& t) {
    int64_t last = 0;
    for (int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
    const char* p = static_cast<const char*>(t.data_ptr());
    return std::make_pair(p, p + (last + 1) * t.element_size());
  };
  const auto [a0, a1] = span(a);
  const auto [b0, b1] = span(b);
  return a0 < b1 && b0 < a1;
}

// One decoding step (rnncc_abi.h: rnncc_decode) into y [O, B, NH, D] (or none) and
// new_states; x [B, I] with W and Wb, or Wx [B, Gx, NH, D]. The Python side checked shapes
// and dtypes; the outputs must not overlap the states, which every block reads.
void decode(const c10::optional<at::Tensor>& x_, const c10::optional<at::Tensor>& W_,
            const c10::optional<at::Tensor>& Wb_, const c10::optional<at::Tensor>& Wx_,
            const c10::optional<at::Tensor>& R_, const c10::optional<at::Tensor>& b_, const at::Tensor& states_,
            const c10::optional<at::Tensor>& params_, int64_t fn, const c10::optional<at::Tensor>& y_,
            const at::Tensor& new_states) {
  c10::cuda::CUDAGuard guard(states_.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor x = opt(x_), W = opt(W_), Wb = opt(Wb_), Wx = opt(Wx_), R = opt(R_), bias = opt(b_),
                   params = opt(params_);
  const at::Tensor y = y_.has_value() ? *y_ : at::Tensor();
  const at::Tensor states = states_view(states_) ? states_ : states_.contiguous();  // only read
  TORCH_CHECK(states.dim() == 4 && states_view(new_states),
              "rnncc decode: new_states must be [S, B, NH, D] with (B, NH, D) contiguous");
  TORCH_CHECK(!y.defined() || y.is_contiguous(), "rnncc decode: y must be contiguous");
  TORCH_CHECK(!overlaps(new_states, states) && !overlaps(y, states),
              "rnncc decode: the new states and outputs must not overlap the states they are computed from");
  rnncc_decode_args a{};
  a.B = states.size(1); a.NH = states.size(2); a.D = states.size(3);
  a.I = x.defined() ? x.size(1) : 0;
  a.dtype = dtype_code(states.scalar_type());
  a.x = cptr(x); a.W = cptr(W); a.Wb = cptr(Wb); a.Wx = cptr(Wx);
  a.R = cptr(R); a.bias = cptr(bias); a.params = cptr(params);
  a.states = states.data_ptr(); a.states_stride = states.stride(0);
  a.y = y.defined() ? y.data_ptr() : nullptr;
  a.new_states = new_states.data_ptr(); a.new_states_stride = new_states.stride(0);
  const int err = reinterpret_cast<rnncc_decode_fn>(fn)(&a, stream);
  TORCH_CHECK(err == 0, "rnncc decode: launching the step kernel failed: ",
              cudaGetErrorString(static_cast<cudaError_t>(err)));
}

// Whether t is a [S, L, B, H] stack of states whose (B, H) parts are contiguous (each
// (state, layer) slice; the layers may repeat one, stride 0): what decode_stack reads and
// writes, a layer's slice being the [S, B, NH, D] view the decoding kernel takes.
bool stack_view(const at::Tensor& t) {
  return t.dim() == 4 && t.stride(3) == 1 && t.stride(2) == t.size(3);
}

// t's element `offset` (in elements, from its data pointer).
void* at_offset(const at::Tensor& t, int64_t offset) {
  return static_cast<char*>(t.data_ptr()) + offset * t.element_size();
}

// One decoding step of a unidirectional stack (rnncc.RNN.step), a launch per layer (rnncc_abi.h:
// rnncc_decode): layer l reads states[:, l] and writes new_states[:, l] ([S, L, B, H], stack_view),
// from x [B, I] (the first layer) or the layer below's output: its new state `first` for a
// one-output cell, else its outputs [O, B, NH, D] as [B, O H] (O: `outputs`); dropout p between
// layers where p > 0. The top layer's outputs go to y [B, O H]. `weights`: layer by layer, those
// of a layer's (W, Wb, R, b, params) that bit 0, 1, ... of `present` marks (the same for every
// layer), as decode takes them. The Python side checked shapes and dtypes; one call from Python
// for the whole stack (the host's time, not the GPU's, bounds a step), its arguments a flat list
// and integers, which the dispatcher converts faster than lists of optional tensors.
void decode_stack(const c10::optional<at::Tensor>& x_, at::TensorList weights, int64_t present,
                  const at::Tensor& states, int64_t fn, int64_t outputs, int64_t heads, int64_t first, double p,
                  const at::Tensor& y, const at::Tensor& new_states) {
  c10::cuda::CUDAGuard guard(new_states.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  TORCH_CHECK(stack_view(states) && stack_view(new_states) && states.sizes() == new_states.sizes(),
              "rnncc decode_stack: states and new_states must be [S, L, B, H] with (B, H) contiguous");
  const int64_t L = new_states.size(1), B = new_states.size(2), H = new_states.size(3);
  const int64_t per = __builtin_popcountll(present & 31), O = outputs;
  TORCH_CHECK(heads > 0 && H % heads == 0 && present >= 0 && present < 32 && (int64_t)weights.size() == L * per,
              "rnncc decode_stack: the present ones of W, Wb, R, b and params for each layer, and heads dividing H");
  TORCH_CHECK(y.is_contiguous() && y.numel() == B * O * H, "rnncc decode_stack: y must be a contiguous [B, O H]");
  TORCH_CHECK(!overlaps(new_states, states) && !overlaps(y, states),
              "rnncc decode_stack: the new states and outputs must not overlap the states they are computed from");
  at::Tensor h = opt(x_), outs;  // a layer's input; the layer's outputs (more than one)
  for (int64_t l = 0; l < L; ++l) {
    if (l > 0) {
      h = O == 1 ? new_states.select(0, first).select(0, l - 1) : outs.permute({1, 0, 2, 3}).reshape({B, O * H});
      if (p > 0) h = at::dropout(h, p, true);
    }
    const bool top = l == L - 1;
    if (O > 1) outs = at::empty({O, B, heads, H / heads}, new_states.options());
    at::Tensor part[5];  // W, Wb, R, b, params; undefined where absent
    for (int64_t j = 0, i = l * per; j < 5; ++j)
      if (present >> j & 1) part[j] = weights[i++].contiguous();
    const at::Tensor &Wl = part[0], &Wbl = part[1], &Rl = part[2], &bl = part[3], &Pl = part[4];
    rnncc_decode_args a{};
    a.B = B; a.NH = heads; a.D = H / heads;
    a.I = Wl.defined() ? h.size(1) : 0;
    a.dtype = dtype_code(new_states.scalar_type());
    a.x = Wl.defined() ? cptr(h) : nullptr; a.W = cptr(Wl); a.Wb = cptr(Wbl); a.Wx = nullptr;
    a.R = cptr(Rl); a.bias = cptr(bl); a.params = cptr(Pl);
    a.states = at_offset(states, l * states.stride(1)); a.states_stride = states.stride(0);
    a.y = O > 1 ? outs.data_ptr() : top ? y.data_ptr() : nullptr;
    a.new_states = at_offset(new_states, l * new_states.stride(1));
    a.new_states_stride = new_states.stride(0);
    a.weights_first = l > 0;  // after the layer below's kernel (or its dropout, or its outputs' copy)
    const int err = reinterpret_cast<rnncc_decode_fn>(fn)(&a, stream);
    TORCH_CHECK(err == 0, "rnncc decode_stack: launching the step kernel of layer ", l, " failed: ",
                cudaGetErrorString(static_cast<cudaError_t>(err)));
  }
  if (O > 1) y.view({B, O * H}).copy_(outs.permute({1, 0, 2, 3}).reshape({B, O * H}));
}

}  // namespace

TORCH_LIBRARY(rnncc_host, m) {
  m.def(
      "stepwise_forward(Tensor Wx, Tensor? R, Tensor? b, Tensor states, Tensor? params, "
      "Tensor? lengths, int reverse_from, int fn, int[] dims, bool save, bool poison) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "stepwise_backward(Tensor dy, Tensor dlast, Tensor Wx, Tensor? R, Tensor? b, "
      "Tensor? params, Tensor? lengths, int reverse_from, Tensor hist, Tensor rh, int fn, int[] dims, bool poison, "
      "bool defer_dR) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "fused_forward(Tensor Wx, Tensor? R, Tensor? b, Tensor states, Tensor? params, "
      "Tensor? lengths, int reverse_from, int fn, int[] dims, int[] launch, bool save, bool poison) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "fused_backward(Tensor dy, Tensor dlast, Tensor Wx, Tensor? R, Tensor? b, "
      "Tensor? params, Tensor? lengths, int reverse_from, Tensor hist, Tensor rh, int fn, int[] dims, int[] launch, "
      "bool poison, bool defer_dR) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("r_gradient(Tensor G, Tensor hist, int[] dims) -> Tensor");
  m.def(
      "decode(Tensor? x, Tensor? W, Tensor? Wb, Tensor? Wx, Tensor? R, Tensor? b, Tensor states, Tensor? params, "
      "int fn, Tensor(a!)? y, Tensor(b!) new_states) -> ()");
  m.def(
      "decode_stack(Tensor? x, Tensor[] weights, int present, Tensor states, int fn, int outputs, int heads, "
      "int first, float dropout, Tensor(a!) y, Tensor(b!) new_states) -> ()");
  m.def("abi_version() -> int", []() -> int64_t { return RNNCC_ABI_VERSION; });
}

TORCH_LIBRARY_IMPL(rnncc_host, CUDA, m) {
  m.impl("stepwise_forward", &stepwise_forward);
  m.impl("stepwise_backward", &stepwise_backward);
  m.impl("fused_forward", &fused_forward);
  m.impl("fused_backward", &fused_backward);
  m.impl("r_gradient", &r_gradient);
  m.impl("decode", &decode);
  m.impl("decode_stack", &decode_stack);
}
