"""Where a grid-tier forward step goes: the cell's generated forward kernel with time stamps
added at its phases, for one run per batch size (bf16, T = 1024, one head, no grad).

Thread 0 of the first and the last block of head 0 (chunk 0) records clock64 at each phase of
every step, and every block's warps 0 and 1 record the globaltimer when the block sees the
step's count complete and when they add their own, for steps 512..575. Printed per step, mean
over steps 16..999 (ns):

    wait (poll) | barrier after poll | h loads + mma + red stores | barrier after product |
    reduce + cell + h stores | count (red.release) | late stores + W x loads

and across blocks: from the step's last count to a block's detection (min, mean, max), the
spread of the counts, and a block's detection to its own count. The stamps patch the generated
text (as benchmarks/ablation.py does) and cost the kernel a few per cent.

Usage (GPU machine): python benchmarks/grid_timeline.py [CELL.rnn] [D] [B1,B2,...]
    e.g. python benchmarks/grid_timeline.py examples/lstm.rnn 768 8,16,64
"""

import argparse
import ctypes
import dataclasses
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

T, STEPS, FIRST = 1024, 64, 512  # every block's stamps: steps FIRST .. FIRST + STEPS - 1
ANCHOR = "namespace rnncc {\nnamespace grid_mma {"  # the grid header, before its kernels


PATCHES = [
    (
        ANCHOR,
        """
__device__ unsigned long long rnncc_tl_phase[2][1024][9];
__device__ unsigned long long rnncc_tl_glob[132][64][2][2];
__device__ __forceinline__ unsigned long long rnncc_gt() {
  unsigned long long v;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(v));
  return v;
}
"""
        + ANCHOR,
    ),
] + indented(
    [
        (
            "  const Exchange ex(a.xchg, a.B, a.NH, n, b0, rows, kRowWarps);\n",
            """  const Exchange ex(a.xchg, a.B, a.NH, n, b0, rows, kRowWarps);
  const int tl_b = blockIdx.y || blockIdx.z ? -1 : blockIdx.x == 0 ? 0 : blockIdx.x == gridDim.x - 1 ? 1 : -1;
  const int tl_lin = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  auto tlc = [&](int t, int p) {
    if (tl_b >= 0 && threadIdx.x == 0 && t < 1024) rnncc_tl_phase[tl_b][t][p] = clock64();
  };
  auto tlg = [&](int t, int k) {
    if (t >= 512 && t < 576 && tl_lin < 132 && (threadIdx.x & 31) == 0 && (threadIdx.x >> 5) < 2)
      rnncc_tl_glob[tl_lin][t - 512][threadIdx.x >> 5][k] = rnncc_gt();
  };
""",
        ),
        (
            "    if (t + kL2Ahead < a.T) wx_l2.prefetch(",
            """    tlc(t, 0);
    if (tl_b >= 0 && threadIdx.x == 0 && t < 1024) rnncc_tl_phase[tl_b][t][8] = rnncc_gt();
    if (t + kL2Ahead < a.T) wx_l2.prefetch(""",
        ),
        (
            "        rnncc::xchg_wait(ex.counter + kNTh * hf, (unsigned)(t + 1) * ex.per_step(kNTh * hf, kNTh));\n",
            """        {
          const unsigned* ctr = ex.counter + kNTh * hf;
          const unsigned target = (unsigned)(t + 1) * ex.per_step(kNTh * hf, kNTh);
          if (threadIdx.x == 0) {
            unsigned v;
            do {
              asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(ctr) : "memory");
            } while (v < target);
            tlc(t, 1);
            tlg(t, 0);
          }
          __syncthreads();
          tlc(t, 2);
        }
""",
        ),
        (
            "        }\n        __syncthreads();\n      }\n      if (cell && jt / kNTh == hf) {",
            "        }\n        tlc(t, 3);\n        __syncthreads();\n        tlc(t, 4);\n      }\n"
            "      if (cell && jt / kNTh == hf) {",
        ),
        (
            "        __syncwarp();\n        if (kGr > 0 && counts && lane == 0 && b0 + 8 * jt < a.B)\n"
            "          rnncc::xchg_count(ex.counter + kNTh * hf);\n",
            "        __syncwarp();\n        tlc(t, 5);\n        if (kGr > 0 && counts && lane == 0 && b0 + 8 * jt < a.B)\n"
            "          rnncc::xchg_count(ex.counter + kNTh * hf);\n        tlc(t, 6);\n        tlg(t, 1);\n",
        ),
        ("    load_wx(t + 2, wxv);", "    load_wx(t + 2, wxv);\n    tlc(t, 7);"),
    ]
)
READER = """
extern "C" int rnncc_tl_read(void* phase, void* glob) {
  cudaError_t e = cudaMemcpyFromSymbol(phase, rnncc_tl_phase, sizeof(rnncc_tl_phase));
  if (e == cudaSuccess) e = cudaMemcpyFromSymbol(glob, rnncc_tl_glob, sizeof(rnncc_tl_glob));
  return (int)e;
}
extern "C" int rnncc_tl_clear() {
  static unsigned long long zero[132 * 64 * 4];
  return (int)cudaMemcpyToSymbol(rnncc_tl_glob, zero, sizeof(zero));
}
"""
PHASES = (
    "wait (poll)",
    "barrier after poll",
    "h loads + mma + red stores",
    "barrier after product",
    "reduce + cell + h stores",
    "count (red.release)",
    "late stores + wx loads",
)


def report(B: int, ops, launch, xs) -> str:
    lib = ops._lib
    with torch.no_grad():
        for _ in range(3):
            ops(*xs, launch)
        torch.cuda.synchronize()
        assert lib.rnncc_tl_clear() == 0
        ops(*xs, launch)
        torch.cuda.synchronize()
    phase = torch.zeros(2 * 1024 * 9, dtype=torch.int64)
    glob = torch.zeros(132 * STEPS * 2 * 2, dtype=torch.int64)
    ptrs = ctypes.c_void_p(phase.data_ptr()), ctypes.c_void_p(glob.data_ptr())
    assert lib.rnncc_tl_read(*ptrs) == 0
    ph = phase.view(2, 1024, 9).double()
    lo, hi = 16, 1000
    ghz = (ph[0, hi, 0] - ph[0, lo, 0]) / (ph[0, hi, 8] - ph[0, lo, 8])
    lines = [f"== B={B}: SM clock {ghz:.3f} GHz; per step (ns), mean over steps {lo}..{hi - 1}"]
    for b, name in ((0, "first"), (1, "last ")):
        period = (ph[b, lo + 1 : hi + 1, 0] - ph[b, lo:hi, 0]) / ghz
        s = f"  block {name}: period {period.mean():7.1f} (med {period.median():7.1f})"
        for p, phase_name in enumerate(PHASES, start=1):
            s += f" | {phase_name} {((ph[b, lo:hi, p] - ph[b, lo:hi, p - 1]) / ghz).mean():6.1f}"
        s += f" | to next step {((ph[b, lo + 1 : hi + 1, 0] - ph[b, lo:hi, 7]) / ghz).mean():5.1f}"
        lines.append(s)
    g = glob.view(132, STEPS, 2, 2).double()
    g = g[(g[:, 0, 0, 0] > 0).nonzero().flatten()]  # [blocks that ran, step, warp, (detect, count)]
    counted = torch.where(g[..., 1] > 0, g[..., 1], torch.full_like(g[..., 1], float("nan")))
    last = torch.nan_to_num(counted, nan=-1).amax(dim=(0, 2))
    first = torch.nan_to_num(counted, nan=1e30).amin(dim=(0, 2))
    detect = g[:, :, 0, 0]
    own = torch.nan_to_num(counted[:, :, 0], nan=0) - detect
    lines.append(
        f"  all {len(g)} blocks, steps {FIRST}..{FIRST + STEPS - 1} (globaltimer ns): last count -> detect "
        f"min {(detect[:, 1:].amin(0) - last[:-1]).mean():6.1f} mean {(detect[:, 1:].mean(0) - last[:-1]).mean():6.1f} "
        f"max {(detect[:, 1:].amax(0) - last[:-1]).mean():6.1f}; count spread (first..last) {(last - first).mean():6.1f}; "
        f"detect -> own count mean {own.mean():6.1f} max-block {own.amax(0).mean():6.1f}"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cell", nargs="?", default="examples/lstm.rnn")
    ap.add_argument("D", nargs="?", type=int, default=768, help="head dim (one head)")
    ap.add_argument("batches", nargs="?", default="8,16,64", help="batch sizes, B1,B2,...")
    args = ap.parse_args()
    path, D = args.cell, args.D
    batches = [int(b) for b in args.batches.split(",")]
    cell = rnncc.load(path)
    build = plan_for(cell, "grid_mma", 1, D, batches[0]).build  # the same for every batch
    srcs = patched_sources(cell, build, ANCHOR, {"plain": [], "stamped": PATCHES})
    srcs["stamped"] = dataclasses.replace(srcs["stamped"], text=srcs["stamped"].text + READER)
    arch = build_all(cell, build, srcs)
    ops = {name: patched_ops(cell, build, arch, src) for name, src in srcs.items()}
    for B in batches:
        launch = plan_for(cell, "grid_mma", 1, D, B).launch
        xs = inputs(cell, B, T, 1, D)
        for name in ("plain", "stamped"):
            with torch.no_grad():
                us = kernel_us(lambda o=ops[name], xs=xs, la=launch: o(*xs, la), "forward_kernel")
            print(f"{path} 1x{D} B={B}: {name} forward kernel (no grad) {us:8.1f} us", flush=True)
        print(report(B, ops["stamped"], launch, xs), flush=True)


if __name__ == "__main__":
    main()
