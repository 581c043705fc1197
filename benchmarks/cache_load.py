"""Build and cache timings of a cell on the current GPU, in fresh processes.

1. Two processes start at once on an empty cache and both run the cell (stepwise): both must
   succeed, and ``builds.log`` must show each library built once (the host loop and the cell).
   Reported: the wall time of that first build.
2. Two more processes load the cell from the warm cache: the time from ``rnncc.load`` to the
   first result (synchronised), after ``import torch`` and a CUDA context, split into front
   end, library loading and first call; once as the first matmul of the process, once after
   one (cuBLAS initialised). Target: ≤ 1 s.

Usage: python benchmarks/cache_load.py [examples/lstm.rnn] [--cache DIR] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time, torch
cell_path, warm_blas = sys.argv[1], sys.argv[2] == "1"
torch.zeros(1, device="cuda"); torch.cuda.synchronize()   # CUDA context up: not ours to time
if warm_blas:  # a process that has already run a matmul (any model with a Linear has)
    torch.bmm(torch.ones(1, 2, 2, device="cuda"), torch.ones(1, 2, 2, device="cuda")); torch.cuda.synchronize()
t0 = time.perf_counter()
import rnncc
cell = rnncc.load(cell_path)
t1 = time.perf_counter()
s = cell.shapes(4, 16, 2, 32)
g = torch.Generator(device="cuda").manual_seed(0)
args = [None if s[k] is None else torch.randn(s[k], device="cuda", generator=g, dtype=torch.bfloat16)
        for k in ("Wx", "R", "b")]
cell.prepare(args[0].device)
t2 = time.perf_counter()
y, last = cell(*args, backend="stepwise")
torch.cuda.synchronize()
t3 = time.perf_counter()
print(json.dumps({"total": round(t3 - t0, 3), "front_end": round(t1 - t0, 3),
                  "libraries": round(t2 - t1, 3), "first_call": round(t3 - t2, 3)}))
"""


def run_child(cell: str, env: dict[str, str], warm_blas: bool = False) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, cell, "1" if warm_blas else "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("cell", nargs="?", default=str(ROOT / "examples" / "lstm.rnn"))
    parser.add_argument("--cache", help="cache folder to use (default: a new temporary one)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    cache = Path(args.cache or tempfile.mkdtemp(prefix="rnncc-cache-"))
    env = dict(
        os.environ,
        RNNCC_CACHE_DIR=str(cache),
        PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )

    t0 = time.perf_counter()
    procs = [run_child(args.cell, env) for _ in range(2)]
    outs = [p.communicate() for p in procs]
    first_build = time.perf_counter() - t0
    for p, (_out, err) in zip(procs, outs, strict=True):
        if p.returncode != 0:
            print(f"a concurrent build failed:\n{err}", file=sys.stderr)
            return 1
    log = (cache / "builds.log").read_text().splitlines()
    names = [line.split()[0] for line in log]
    duplicates = sorted({n for n in names if names.count(n) > 1})

    cached = {}
    for warm in (False, True):
        proc = run_child(args.cell, env, warm_blas=warm)
        out, err = proc.communicate()
        if proc.returncode != 0:
            print(err, file=sys.stderr)
            return 1
        cached["blas_warm" if warm else "cold"] = json.loads(out.strip().splitlines()[-1])
    result = {
        "cell": Path(args.cell).stem,
        "first_build_s_two_concurrent_processes": round(first_build, 2),
        "builds": names,
        "duplicate_builds": duplicates,
        "cached_load_to_first_result_s": cached,
        "note": "cold: the first cuBLAS call of the process (handle creation) is inside the "
        "timed region; blas_warm: the process ran one matmul before rnncc.load",
    }
    print(json.dumps(result, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if not duplicates and len(names) == 2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
