#!/usr/bin/env bash
# On the GPU machine: where a fused kernel's time goes. Per-step slopes (profile_fused.py), then
# ncu (clocks left alone) on one forward + backward at T=256: warp stall reasons, and the SASS
# instructions with the most stall samples. Usage: bash benchmarks/ncu_fused.sh CELL [args]
set -uo pipefail
OUT=${OUT:-/tmp/rnncc-out}; mkdir -p "$OUT"
cell=$1; shift
name=$(basename "$cell" .rnn)
python3 benchmarks/profile_fused.py "$cell" "$@" 2>&1 | tee "$OUT/slope_$name.txt"
ncu --clock-control none --set full --import-source yes -k regex:fused_ -o "$OUT/ncu_$name" -f \
  python3 benchmarks/profile_fused.py "$cell" "$@" --once 256 > "$OUT/ncu_$name.log" 2>&1
ncu --import "$OUT/ncu_$name.ncu-rep" --page details --print-details all > "$OUT/ncu_${name}_details.txt" 2>&1
ncu --import "$OUT/ncu_$name.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu_${name}_sass.csv" 2>&1
python3 benchmarks/ncu_top.py "$OUT/ncu_${name}_sass.csv" --top 30
grep -E "Duration|Warp Cycles Per Issued|Stall|Issued Warp|Registers" "$OUT/ncu_${name}_details.txt" | head -12
