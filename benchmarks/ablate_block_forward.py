"""Where the block-tier forward's step goes: the 12 x 64 LSTM forward kernel (B = 16, T = 1024,
bf16) built with parts of its generated source removed, each variant's kernel time (torch
profiler, no-grad and training mode). The variants patch the generated text: they fit the
LSTM at this size only, and compute wrong values (timing only).

Usage (GPU machine): python benchmarks/ablate_block_forward.py
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ablation import (
    build_all,
    indented,
    inputs,
    kernel_us,
    patched_ops,
    patched_sources,
    plan_for,
)

import rnncc

NH, D, B = 12, 64, 16
WX = (
    "for (int k = 0; k < kGx; ++k) wxv[k][q] = w[(2 * c4 + q) * (kWxRow / 2) + k * kD];",
    "for (int k = 0; k < kGx; ++k) wxv[k][q] = 0x3c00u + k;",
)
COPY = ("    copy_wx(t + kWxAhead);\n", "")
# W x also prefetched into L2, 8 steps ahead (as before the copies through shared memory).
L2 = (
    "    copy_wx(t + kWxAhead);\n",
    "    copy_wx(t + kWxAhead);\n    if (t + kL2Ahead < a.T) wx_l2.prefetch((long long)t * kGx * NHD * 2);\n",
)
L2_INIT = (
    "  auto step = [&](const int t) {",
    """  constexpr int kL2Ahead = 8;
  rnncc::L2Stream<rnncc::l2_lines_per_thread(kBC * kGx, kD * 2, kMmaThreads)> wx_l2;
  wx_l2.init(static_cast<const T*>(a.Wx) + ((long long)b0 * a.T + kL2Ahead) * kGx * NHD + (long long)n * kD,
             (long long)a.T * kGx * NHD, a.B - b0 < kBC ? a.B - b0 : kBC, NHD, kGx, kD, threadIdx.x, kMmaThreads);
  auto step = [&](const int t) {""",
)
Y = (
    "for (int o = 0; o < kO; ++o) yp[q][o * yO] = rnncc::from_float<T>(next[C::output_state(o)]);\n",
    "for (int o = 0; o < 0; ++o) yp[q][o * yO] = rnncc::from_float<T>(next[C::output_state(o)]);\n",
)
BAR = ("    __syncthreads();\n  };\n#pragma unroll 2", "  };\n#pragma unroll 2")
SPLIT = (
    """#pragma unroll
        for (int p = 0; p < kPairs; ++p) rnncc::mma16816<T>(acc[p], ra[p][kt], h0, h1);
      }
    }""",
    """#pragma unroll
        for (int p = 0; p < kPairs; ++p) rnncc::mma16816<T>((kt & 1) ? acc2[p] : acc[p], ra[p][kt], h0, h1);
      }
#pragma unroll
      for (int p = 0; p < kPairs; ++p)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[p][i] += acc2[p][i];
    }""",
)
SPLIT0 = (
    """    float acc[kPairs][4];
#pragma unroll
    for (int p = 0; p < kPairs; ++p)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[p][i] = 0.0f;
    if (kGr > 0) {
      const T* hb = &hsm""",
    """    float acc[kPairs][4], acc2[kPairs][4];
#pragma unroll
    for (int p = 0; p < kPairs; ++p)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[p][i] = acc2[p][i] = 0.0f;
    if (kGr > 0) {
      const T* hb = &hsm""",
)
CELL = (
    "static void forward(const In& in",  # the cell, in the generated struct Cell
    "    const float new_c = rnncc_sigmoid(g_f) * s_c + rnncc_sigmoid(g_i) * rnncc_tanh(g_z);\n"
    "    next[0] = rnncc_sigmoid(g_o) * rnncc_tanh(new_c);",
    "    const float new_c = g_f * s_c + g_i * g_z;\n    next[0] = g_o * new_c;",
)
WX, COPY, L2_INIT, L2, Y, BAR, SPLIT0, SPLIT = indented(
    [WX, COPY, L2_INIT, L2, Y, BAR, SPLIT0, SPLIT]
)
ABLATIONS = {
    "base": [],
    "no-wx-load": [WX, COPY],
    "no-wx-copy": [COPY],
    "with-l2-prefetch": [L2_INIT, L2],
    "no-y-store": [Y],
    "no-barrier": [BAR],
    "no-activations": [CELL],
    "split-k": [SPLIT0, SPLIT],
    "no-global-memory": [WX, COPY, Y],
    "no-global-no-activations": [WX, COPY, Y, CELL],
}


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    cell = rnncc.load("examples/lstm.rnn")
    plan = plan_for(cell, "block_mma", NH, D, B)
    kernel = "void forward(const rnncc_fused_args& a)"
    sources = patched_sources(cell, plan.build, kernel, ABLATIONS)
    arch = build_all(cell, plan.build, sources)
    xs = inputs(cell, B, 1024, NH, D)
    for name, src in sources.items():
        ops = patched_ops(cell, plan.build, arch, src)
        times = {}
        for mode in ("no_grad", "train"):
            ins = [None if v is None else v.clone().requires_grad_(mode == "train") for v in xs]
            with torch.set_grad_enabled(mode == "train"):
                times[mode] = kernel_us(
                    lambda ops=ops, ins=ins: ops(*ins, plan.launch), "forward_kernel"
                )
        print(
            f"{name:26s} fw kernel no_grad {times['no_grad']:7.1f} us "
            f"({times['no_grad'] / 1024 * 1e3:5.0f} ns/step)  train {times['train']:7.1f} us",
            flush=True,
        )


if __name__ == "__main__":
    main()
