"""Where the block-tier backward's step goes: the 12 x 64 LSTM backward kernel (B = 16,
T = 1024, bf16) built with parts of its generated source removed, each variant's kernel time
(torch profiler, after a training-mode forward). The variants patch the generated text: they
fit the LSTM at this size only, and compute wrong values (timing only).

Usage (GPU machine): python benchmarks/ablate_block_backward.py
"""

import argparse
import sys
from pathlib import Path

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
# dh += dgᵀ·R on the tensor cores (with it go its loads of dg from shared memory).
PRODUCT = ("        rnncc::mma16816<T>(acc[kt % kChains], ga, rb[kt][0], rb[kt][1]);\n", "")
# The step's dWx and dGr out of shared memory to global memory (OutCopies).
DWX = ("    ox.copy(t, dws[t & 1]);\n", "")
DGR = ("    og.copy(t, reinterpret_cast<const unsigned char*>(&dgs[t & 1][0][0]));\n", "")
# The lanes' stores of the gate cotangents into shared memory (dGr and the product's operand).
DG_SMEM = (
    "        put2(&dgs[t & 1][b][k * kKP + d0], hi, rnncc::from_float<T>(o.gr[k][0]), "
    "rnncc::from_float<T>(o.gr[k][1]));\n",
    "",
)
# The step's input copies into the ring (the group is still closed, so the waits hold).
COPIES = ("    copy_inputs(t - kInAhead);\n", "    rnncc::cp_async_commit();\n")
WAIT = "    rnncc::cp_async_wait<kInAhead - 1>();  // step t - 1's inputs (earlier steps' may be in flight)\n"
BAR = (WAIT + "    __syncthreads();\n", WAIT)
HOOK = "static void backward(const In& in"  # the backward cell, in the generated struct Cell
ACT = [
    (HOOK, "rnncc_sigmoid(g_o)", "g_o"),
    (HOOK, "rnncc_sigmoid(g_f)", "g_f"),
    (HOOK, "rnncc_sigmoid(g_i)", "g_i"),
    (HOOK, "rnncc_tanh(g_z)", "g_z"),
    (HOOK, "rnncc_tanh(v_t2 * s_c + v_t3 * v_t4)", "(v_t2 * s_c + v_t3 * v_t4)"),
]
PRODUCT, DWX, DGR, DG_SMEM, COPIES, BAR = indented([PRODUCT, DWX, DGR, DG_SMEM, COPIES, BAR])
ABLATIONS = {
    "base": [],
    "no-product": [PRODUCT],
    "no-dwx-store": [DWX],
    "no-dgr-store": [DGR],
    "no-global-stores": [DWX, DGR],
    "no-input-copies": [COPIES],
    "no-dg-smem-store": [DG_SMEM],
    "no-barrier": [BAR],
    "no-activations": ACT,
    "no-global-memory": [DWX, DGR, COPIES],
    "no-global-no-activations": [DWX, DGR, COPIES, *ACT],
    "product-barrier-only": [DWX, DGR, COPIES, *ACT, DG_SMEM],
}


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    cell = rnncc.load("examples/lstm.rnn")
    plan = plan_for(cell, "block_mma", NH, D, B)
    kernel = "void backward(const rnncc_fused_bwd_args& a)"
    sources = patched_sources(cell, plan.build, kernel, ABLATIONS)
    arch = build_all(cell, plan.build, sources)
    xs = inputs(cell, B, 1024, NH, D)
    for name, src in sources.items():
        ops = patched_ops(cell, plan.build, arch, src)
        ins = [None if v is None else v.clone().requires_grad_() for v in xs]

        def run(ops=ops, ins=ins) -> None:
            for v in ins:
                if v is not None:
                    v.grad = None
            y, last = ops(*ins, plan.launch)
            (y.float().sum() + last.float().sum()).backward()

        us = kernel_us(run, "backward_kernel")
        print(f"{name:26s} bw kernel {us:7.1f} us ({us / 1024 * 1e3:5.0f} ns/step)", flush=True)


if __name__ == "__main__":
    main()
