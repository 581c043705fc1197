"""A results JSON → a Markdown report, PNG plots and the README's benchmark block (CPU side).

Input: ``<stem>.json`` as ``benchmarks/run_suite.py`` writes it (``{"machine", "protocol",
"build", "records"}``; ``rnncc bench --json`` files work too). Output, beside the JSON or in
``--out-dir``:

- ``<stem>.md``: the machine, one table per sweep (rows: cell and sizes; columns: systems;
  cells ``fw / fwbw`` ms and, for rnncc, the ratios to cuDNN fp16 measured in the same run),
  the anchors beside BENCHMARKS.md's figures, build times, and what was not measured and why;
- ``<stem>-headdim.png``, ``-batch.png``, ``-seq.png``: time against head dim, batch and T,
  one line per system, fw and fwbw, one column per cell — when matplotlib is installed (the
  GPU machine has none: plots are drawn here; without it they are skipped with a message);
- with ``--readme README.md``: the block between ``<!-- bench-table -->`` and
  ``<!-- /bench-table -->`` replaced by the head-dim table and the plot; without the markers
  it prints what to add and changes nothing.

Ratios: cuDNN runs one dense head, so every head split of hidden H is compared with cuDNN at
hidden H, same cell, B and T. sLSTM has no cuDNN kernel: its ratios (marked †) are to cuDNN
LSTM.

Usage: python benchmarks/report.py RESULTS.json [--out-dir DIR] [--readme README.md] [--no-plots]

Non-goals: measuring anything; importing torch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from rnncc.bench import fmt_ms  # noqa: E402  (imports no torch)

BEGIN, END = "<!-- bench-table -->", "<!-- /bench-table -->"
CELL_ORDER = ("lstm", "gru", "slstm")
SWEEPS = {  # name → (title, the size on the x axis)
    "headdim": ("Head dimension (hidden = NH × D = 768)", "D"),
    "seq": ("Sequence length", "T"),
    "batch": ("Batch size", "B"),
}
#: BENCHMARKS.md, "Measured anchors" (H100 80GB HBM3, T = 1024): (system, cell, dtype, B,
#: hidden) → (fw, fwbw) ms.
REFERENCE = {
    ("cudnn", "lstm", "fp16", 16, 768): (2.47, 7.48),
    ("cudnn", "lstm", "fp16", 16, 256): (2.19, 6.22),
    ("cudnn", "lstm", "fp16", 16, 1024): (2.45, 8.16),
    ("cudnn", "lstm", "fp16", 64, 768): (7.88, 21.1),
    ("cudnn", "lstm", "bf16", 16, 768): (19.4, 42.3),
    ("cudnn", "lstm", "fp32", 16, 768): (14.6, 38.1),
    ("torch-loop", "lstm", "bf16", 16, 768): (164.0, 632.0),
}

Rec = dict[str, Any]


def _cell_rank(cell: str) -> tuple[int, str]:
    return (CELL_ORDER.index(cell) if cell in CELL_ORDER else len(CELL_ORDER), cell)


def _ms(x: float | None) -> str:
    return "—" if x is None else fmt_ms(x)


def _pair(r: Rec | None) -> str:
    return "—" if r is None else f"{_ms(r['fw_ms'])} / {_ms(r['fwbw_ms'])}"


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or not b:
        return "—"
    x = a / b
    return f"{x:.{2 if x < 1 else 1 if x < 10 else 0}f}×"


def _ok(records: Iterable[Rec]) -> list[Rec]:
    return [r for r in records if r.get("status", "ok") == "ok"]


def cudnn_for(records: list[Rec], r: Rec, dtype: str = "fp16") -> tuple[Rec | None, bool]:
    """The cuDNN record to compare ``r`` with (same cell, or LSTM for a cell without one;
    same B, T and hidden) and whether it is the LSTM stand-in."""
    hidden = r["NH"] * r["D"]
    found: dict[str, Rec] = {}
    for c in _ok(records):
        if (c["system"], c["dtype"], c["B"], c["T"], c["NH"] * c["D"]) == (
            "cudnn",
            dtype,
            r["B"],
            r["T"],
            hidden,
        ):
            found[c["cell"]] = c
    if r["cell"] in found:
        return found[r["cell"]], False
    has_own = any(c["system"] == "cudnn" and c["cell"] == r["cell"] for c in records)
    return (None, False) if has_own else (found.get("lstm"), "lstm" in found)


def sweep_table(data: dict[str, Any], sweep: str) -> str:
    """One Markdown table of a sweep: a row per (cell, B, T, NH, D), a column per system."""
    records = data["records"]
    tagged = [r for r in records if sweep in r.get("sweeps", [])]
    rnncc = [r for r in tagged if r["system"].startswith("rnncc-")]
    systems = list(dict.fromkeys(r["system"] for r in _ok(rnncc)))
    cudnn_dtypes = sorted(
        {r["dtype"] for r in _ok(tagged) if r["system"] == "cudnn"}, key=lambda d: (d != "fp16", d)
    )
    loop = {
        (r["cell"], r["B"], r["T"], r["NH"], r["D"]): r
        for r in _ok(tagged)
        if r["system"] == "torch-loop"
    }
    rows = sorted(
        {(r["cell"], r["B"], r["T"], r["NH"], r["D"]) for r in rnncc},
        key=lambda k: (_cell_rank(k[0]), k[1], k[2], -k[3]),
    )
    if not rows:
        return "_no measurements_\n"
    varying = [n for k, n in ((1, "B"), (2, "T")) if len({row[k] for row in rows}) > 1]
    head = ["cell", *varying, "NH × D", *systems]
    head += [f"cuDNN {d} (1 head)" for d in cudnn_dtypes]
    head += ["torch-loop"] if loop else []
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    dagger = False
    for cell, B, T, NH, D in rows:
        key = {"cell": cell, "B": B, "T": T, "NH": NH, "D": D}
        cols = [cell] + [str(key[n]) for n in varying] + [f"{NH} × {D}"]
        ref, stand_in = cudnn_for(records, key)
        dagger |= stand_in and ref is not None
        for system in systems:
            r = next((x for x in _ok(rnncc) if x["system"] == system and _same(x, key)), None)
            text = _pair(r)
            if r is not None and ref is not None:
                mark = "†" if stand_in else ""
                fw, fwbw = _ratio(r["fw_ms"], ref["fw_ms"]), _ratio(r["fwbw_ms"], ref["fwbw_ms"])
                text += f" ({fw} / {fwbw}{mark})"
            cols.append(text)
        for d in cudnn_dtypes:
            cols.append(_pair(cudnn_for(records, key, d)[0] if not stand_in else None))
        if loop:
            cols.append(_pair(loop.get((cell, B, T, NH, D))))
        lines.append("| " + " | ".join(cols) + " |")
    notes = "ms, `fw / fwbw`; in parentheses the ratio to cuDNN fp16 at the same hidden size."
    if dagger:
        notes += " † sLSTM (no cuDNN kernel): ratio to cuDNN LSTM."
    return "\n".join(lines) + "\n\n" + notes + "\n"


def _same(r: Rec, key: dict[str, Any]) -> bool:
    return all(r[k] == v for k, v in key.items())


def anchor_table(data: dict[str, Any]) -> str:
    """The anchors (cuDNN, the PyTorch loop) beside BENCHMARKS.md's figures."""
    rows = [r for r in _ok(data["records"]) if "anchor" in r.get("sweeps", [])]
    if not rows:
        return "_no anchors measured_\n"
    lines = [
        "| system | cell | dtype | B | NH × D | fw | fwbw | BENCHMARKS.md | ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ref = REFERENCE.get((r["system"], r["cell"], r["dtype"], r["B"], r["NH"] * r["D"]))
        ratio = (
            f"{_ratio(r['fw_ms'], ref[0])} / {_ratio(r['fwbw_ms'], ref[1])}"
            if ref and r["T"] == 1024
            else "—"
        )
        lines.append(
            f"| {r['system']} | {r['cell']} | {r['dtype']} | {r['B']} | {r['NH']} × {r['D']} | "
            f"{_ms(r['fw_ms'])} | {_ms(r['fwbw_ms'])} | "
            f"{f'{_ms(ref[0])} / {_ms(ref[1])}' if ref else '—'} | {ratio} |"
        )
    return "\n".join(lines) + "\n\nT = 1024; ms; ratio = measured / BENCHMARKS.md.\n"


def build_section(data: dict[str, Any]) -> str:
    build = data.get("build")
    if not build:
        return "_not measured_\n"
    lines = [
        f"- up front, in parallel ({'cold cache: compiled ' + ', '.join(build.get('compiled', [])) if build.get('cold_cache') else 'warm cache'}): "
        f"{build.get('parallel_wall_s')} s wall; per cell {build.get('per_cell_s')}",
    ]
    for cell, got in build.get("cached_new_process", {}).items():
        if "error" in got:
            lines.append(f"- {cell}, cached, new process: failed: {got['error']}")
        else:
            lines.append(
                f"- {cell}, cached, new process: `rnncc.load` to the first result "
                f"{got['load_to_first_result_s']} s (front end {got['load_s']} s, libraries and "
                f"first call {got['first_call_s']} s)"
            )
    return "\n".join(lines) + "\n"


def missing_section(data: dict[str, Any]) -> str:
    groups: dict[tuple[str, str, str], int] = {}
    for r in data["records"]:
        if r.get("status", "ok") != "ok":
            k = (r["system"], r["status"], r["note"])
            groups[k] = groups.get(k, 0) + 1
    if not groups:
        return "_everything planned was measured_\n"
    return "".join(f"- {s}: {st} ×{n}: {note}\n" for (s, st, note), n in groups.items())


def _cudnn_version(v: Any) -> str:
    """torch's integer (cuDNN 9: major·10000 + minor·100 + patch) as ``9.19.0``."""
    return (
        f"{v // 10000}.{v // 100 % 100}.{v % 100}" if isinstance(v, int) and v >= 10000 else str(v)
    )


def machine_line(m: dict[str, Any]) -> str:
    parts = [
        m.get("gpu") or f"CPU {m.get('cpu', '')}",
        f"{m['sm_count']} SMs" if m.get("sm_count") else None,
        f"driver {m['driver']}" if m.get("driver") else None,
        f"torch {m.get('torch')}",
        f"CUDA {m.get('cuda')}",
        f"cuDNN {_cudnn_version(m['cudnn'])}" if m.get("cudnn") else None,
        f"rnncc {m.get('rnncc')}" + (f" ({m['rnncc_commit']})" if m.get("rnncc_commit") else ""),
        m.get("date"),
    ]
    return ", ".join(p for p in parts if p)


def markdown(data: dict[str, Any], name: str = "results") -> str:
    """The whole report as Markdown."""
    m = data["machine"]
    proto = data.get("protocol", {})
    out = [
        f"# rnncc benchmarks — {m.get('gpu') or 'CPU'}, {m.get('date')}\n",
        f"{machine_line(m)}. From `{name}`.",
    ]
    if proto:
        out.append(
            f"Median of {proto.get('repeats')} timed calls after {proto.get('warmup')} warm-up "
            f"({proto.get('loop_repeats')} for the PyTorch loop); {proto.get('timer')}. "
            f"fw: {proto.get('fw')}; fwbw: {proto.get('fwbw')}. {proto.get('module')}; "
            f"{proto.get('cudnn_heads')}.\n"
        )
    out += ["## Anchors\n", anchor_table(data)]
    for sweep, (title, _) in SWEEPS.items():
        out += [f"## {title}\n", sweep_table(data, sweep)]
    out += ["## Build\n", build_section(data), "## Not measured\n", missing_section(data)]
    return "\n".join(out)


def readme_block(data: dict[str, Any], md_link: str, png_link: str | None) -> str:
    m = data["machine"]
    text = [
        f"{machine_line(m)}; B = 16, T = 1024, bf16, hidden 768, ms `fw / fwbw` "
        f"(full results: [{Path(md_link).name}]({md_link}), made by `benchmarks/run_suite.py` "
        "and `benchmarks/report.py`).\n",
        sweep_table(data, "headdim"),
    ]
    if png_link:
        text.append(f"![time against head dimension]({png_link})\n")
    return "\n".join(text)


def replace_block(text: str, block: str) -> str | None:
    """``text`` with the part between the markers replaced by ``block``; None without them."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        return None
    return text[: start + len(BEGIN)] + "\n" + block.rstrip("\n") + "\n" + text[end:]


#: Line colours per system (cuDNN per dtype), stable across plots.
COLORS = {
    "rnncc-stepwise": "C1",
    "rnncc-stepwise-module": "C2",
    "rnncc-fused": "C3",
    "rnncc-fused-module": "C4",
    "cudnn fp16": "C0",
    "cudnn bf16": "C9",
    "cudnn fp32": "C7",
    "torch-loop": "k",
}


def _series(data: dict[str, Any], sweep: str, cell: str) -> dict[str, list[Rec]]:
    """Label → the records of one line of a panel (a cell's panel of a sweep). Lines: each
    system, per head split outside the head-dim sweep; cuDNN per dtype (cuDNN LSTM fp16 for
    a cell without a cuDNN kernel)."""
    tagged = [r for r in _ok(data["records"]) if sweep in r.get("sweeps", [])]
    has_cudnn = any(r["system"] == "cudnn" and r["cell"] == cell for r in data["records"])
    out: dict[str, list[Rec]] = {}
    for r in tagged:
        if r["system"] == "cudnn":
            if r["cell"] == cell:
                label = f"cudnn {r['dtype']}"
            elif r["cell"] == "lstm" and not has_cudnn and r["dtype"] == "fp16":
                label = "cudnn fp16 (LSTM)"
            else:
                continue
        elif r["cell"] == cell:
            split = "" if sweep == "headdim" else f" {r['NH']}×{r['D']}"
            label = r["system"] + split
        else:
            continue
        out.setdefault(label, []).append(r)
    return out


def _draw(ax: Any, label: str, recs: list[Rec], sweep: str, xname: str, phase: str) -> None:
    pts = sorted((r[xname], r[f"{phase}_ms"]) for r in recs if r[f"{phase}_ms"] is not None)
    if not pts:
        return
    system = recs[0]["system"]
    key = f"cudnn {recs[0]['dtype']}" if system == "cudnn" else system
    style = {"color": COLORS.get(key), "label": label}
    if system == "cudnn" and sweep == "headdim":  # one dense head: the same at every D
        ax.axhline(pts[-1][1], linestyle="--", **style)
    elif system == "torch-loop":
        ax.plot(*zip(*pts), marker="x", linestyle="", markersize=8, **style)
    else:
        dense = recs[0]["NH"] == 1 and sweep != "headdim"  # 1×768 beside 12×64: dotted
        line = "--" if system == "cudnn" else ":" if dense else "-"
        ax.plot(*zip(*pts), marker="o", markersize=4, linestyle=line, **style)


def plot(data: dict[str, Any], stem: Path) -> list[Path]:
    """One PNG per sweep (columns: cells; rows: fw, fwbw); [] with a message when matplotlib
    is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(
            "report: matplotlib is not installed: no plots (pip install matplotlib)",
            file=sys.stderr,
        )
        return []
    written = []
    for sweep, (title, xname) in SWEEPS.items():
        tagged = [r for r in _ok(data["records"]) if sweep in r.get("sweeps", [])]
        cells = sorted({r["cell"] for r in tagged if r["system"] != "cudnn"}, key=_cell_rank)
        if not cells:
            continue
        xs = sorted({r[xname] for r in tagged if r["system"] != "cudnn"})
        fig, axes = plt.subplots(2, len(cells), figsize=(4.5 * len(cells), 7.5), squeeze=False)
        for col, cell in enumerate(cells):
            for row, phase in enumerate(("fw", "fwbw")):
                ax = axes[row][col]
                for label, recs in _series(data, sweep, cell).items():
                    _draw(ax, label, recs, sweep, xname, phase)
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
                ax.set_xticks(xs, [str(x) for x in xs])
                ax.set_title(f"{cell}: {phase}")
                ax.set_xlabel(xname + (" (NH = 768 / D)" if sweep == "headdim" else ""))
                ax.set_ylabel("ms (log)")
                ax.grid(True, which="both", alpha=0.3)
                ax.legend(fontsize=7)
        fig.suptitle(f"{title}\n{machine_line(data['machine'])}", fontsize=9)
        fig.tight_layout()
        path = stem.with_name(f"{stem.name}-{sweep}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("results", help="a results JSON")
    ap.add_argument("--out-dir", help="where to write (default: beside the JSON)")
    ap.add_argument("--readme", help="README.md whose bench-table block to replace")
    ap.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    args = ap.parse_args(argv)
    src = Path(args.results)
    try:
        data = json.loads(src.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        print(f"report: error: {src}: cannot read: {err}", file=sys.stderr)
        return 1
    if not isinstance(data, dict) or not {"machine", "records"} <= data.keys():
        print(
            f'report: error: {src}: not a results file (no "machine" and "records")',
            file=sys.stderr,
        )
        return 1
    out_dir = Path(args.out_dir) if args.out_dir else src.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / src.stem
    md = stem.with_suffix(".md")
    md.write_text(markdown(data, src.name), encoding="utf-8")
    print(f"wrote {md}")
    pngs = [] if args.no_plots else plot(data, stem)
    for p in pngs:
        print(f"wrote {p}")
    if args.readme:
        readme = Path(args.readme)
        base = readme.resolve().parent
        rel = lambda p: Path(os.path.relpath(p.resolve(), base)).as_posix()  # noqa: E731
        headdim = next((p for p in pngs if p.name.endswith("-headdim.png")), None)
        block = readme_block(data, rel(md), rel(headdim) if headdim else None)
        text = readme.read_text(encoding="utf-8")
        new = replace_block(text, block)
        if new is None:
            print(
                f"report: {readme} has no {BEGIN} … {END} block; add these lines where the "
                f"table belongs and run again:\n\n{BEGIN}\n{block}{END}",
                file=sys.stderr,
            )
        else:
            readme.write_text(new, encoding="utf-8")
            print(f"updated the benchmark block of {readme}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
