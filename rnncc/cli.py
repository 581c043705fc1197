"""The ``rnncc`` command (also ``python -m rnncc``).

Subcommands:

- ``rnncc check FILE...`` — parse and check; print every diagnostic; exit 1 on any error;
- ``rnncc show FILE [--cell NAME] [--backward]`` — the checked IR in surface syntax (folded,
  CSE'd), or the derived backward cell;
- ``rnncc compile FILE -o DIR [--cell NAME]`` — write DIR as an importable Python package of
  the cell (IR, backward IR and source as data; importing it runs no front end);
- ``rnncc plan FILE --hidden H ...`` — the plan: the kernel variant that runs those sizes, its
  launch and predicted cost;
- ``rnncc bench FILE --hidden H ...`` — time the cell on rnncc's backends and the baselines.
- ``rnncc cache list|clear [GLOB...]|prune --max-size SIZE`` — the built-kernel cache.

User errors print compiler-style diagnostics to stderr and exit 1, never a traceback.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rnncc import __version__
from rnncc.errors import Diagnostic, DslError, RnnccError

if TYPE_CHECKING:  # the front end is imported when a command needs it
    from rnncc.ir.cell import Cell
    from rnncc.runtime.cache import Entry
    from rnncc.tiling import Plan
    from rnncc.tiling.hardware import HardwareCaps


def _read(path: str) -> str:
    """The file's text. An unreadable file is the tool's error (``rnncc: error: path: cannot
    read: ...``), not a diagnostic of a source, so it travels as a plain ``RnnccError``."""
    from rnncc.errors import SourceReadError
    from rnncc.frontend import read_source

    try:
        return read_source(path)
    except SourceReadError as err:
        raise RnnccError(str(err)) from None


def _compile(path: str) -> tuple[list[Cell], list[Diagnostic]]:
    from rnncc.frontend import compile_source

    return compile_source(_read(path), path)


def _print_warnings(diags: list[Diagnostic]) -> None:
    for d in diags:
        print(d.render(), file=sys.stderr)


def _pick(cells: list[Cell], name: str | None, path: str) -> Cell:
    from rnncc.frontend import select_cell

    return select_cell(cells, name, path, how="--cell NAME")


def cmd_check(args: argparse.Namespace) -> int:
    failed = False
    for path in args.files:
        try:
            cells, warns = _compile(path)
        except DslError as err:
            print(err, file=sys.stderr)
            failed = True
            continue
        except RnnccError as err:  # an unreadable file: report it and check the others
            print(f"rnncc: error: {err}", file=sys.stderr)
            failed = True
            continue
        _print_warnings(warns)
        if not args.quiet:
            names = ", ".join(c.name for c in cells)
            print(f"{path}: ok ({len(cells)} cell{'s' if len(cells) != 1 else ''}: {names})")
    return 1 if failed else 0


def cmd_show(args: argparse.Namespace) -> int:
    from rnncc.autodiff import derive_backward
    from rnncc.ir.printer import print_backward, print_cell

    cells, warns = _compile(args.file)
    _print_warnings(warns)
    chosen = cells if args.cell is None else [_pick(cells, args.cell, args.file)]
    texts = [print_backward(derive_backward(c)) if args.backward else print_cell(c) for c in chosen]
    print("\n".join(texts), end="")
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from rnncc.runtime.package import write_package
    from rnncc.variants.stepwise import BUILD as STEPWISE_BUILD

    if args.hidden is None:  # the plan's other sizes mean nothing without it
        given = [
            f"--{name}"
            for name, default in _PLAN_DEFAULTS.items()
            if getattr(args, name) != default
        ]
        if given:
            raise RnnccError(
                f"{', '.join(given)} size the planned kernels, which need --hidden H "
                "(without it the package holds the cell and its stepwise kernels only)"
            )
    cells, warns = _compile(args.file)
    _print_warnings(warns)
    cell = _pick(cells, args.cell, args.file)
    arch = _prebuild_arch(args) if args.prebuild else None  # checked before anything is written
    files, builds = _plan_files(cell, args) if args.hidden is not None else (None, [])
    builds = [STEPWISE_BUILD, *builds]
    try:
        out = write_package(cell, Path(args.output), plan=files, builds=builds)
    except OSError as err:
        raise RnnccError(f"{args.output}: cannot write: {err.strerror or err}") from None
    print(f"wrote {out} (cell '{cell.name}'); import it with the parent folder on sys.path")
    if arch is not None:
        from rnncc.autodiff import derive_backward
        from rnncc.runtime.kernels import build_kernels, host_library

        host = host_library(arch)
        backward = derive_backward(cell)
        for build in builds:
            library = build_kernels(cell, backward, build, arch)
            print(f"prebuilt {build['variant']} for {arch}: {library}")
        print(f"host loop: {host}")
    return 0


def _prebuild_arch(args: argparse.Namespace) -> str:
    """The arch --prebuild builds for, once it is clear that a build can run here: a CUDA
    build of torch, nvcc, and a target (--arch or the GPU)."""
    import shutil

    import torch
    from torch.utils import cpp_extension

    if torch.version.cuda is None:
        raise RnnccError(
            f"this torch ({torch.__version__}) is a CPU build: "
            "--prebuild needs a CUDA build of torch"
        )
    if cpp_extension.CUDA_HOME is None and shutil.which("nvcc") is None:
        raise RnnccError(
            "no CUDA compiler: nvcc is not on PATH and CUDA_HOME is not set; "
            "--prebuild needs the CUDA toolkit"
        )
    from rnncc.config import get_config
    from rnncc.runtime.cache import ensure_writable

    ensure_writable(get_config().cache_dir)
    caps = _target_caps(args)
    if caps is None:
        return _device_arch()
    return "sm_90a" if caps.arch == "sm_90" else caps.arch  # Hopper: wgmma needs the 'a'


def _target_caps(args: argparse.Namespace) -> HardwareCaps | None:
    """The GPU that --device (a name: "A100 80GB", "L40S") or --arch (sm_90, h100, a100) names;
    None when neither is given (this machine's GPU). Given both, they must agree on the arch."""
    from rnncc.errors import TilingError
    from rnncc.tiling import caps_for_arch

    try:
        device = caps_for_arch(args.device) if args.device else None
        arch = caps_for_arch(args.arch) if args.arch else None
    except TilingError as err:
        raise RnnccError(str(err)) from None
    if device is not None and arch is not None and device.arch != arch.arch:
        raise RnnccError(
            f"--device {args.device!r} is an {device.arch} GPU ({device.name}), "
            f"but --arch {args.arch!r} is {arch.arch}"
        )
    return device or arch


def _device_arch() -> str:
    import torch

    if not torch.cuda.is_available():
        raise RnnccError("no CUDA device here: name the target with --arch (e.g. sm_90a)")
    from rnncc.runtime.build import device_arch

    return device_arch()


def cmd_cache(args: argparse.Namespace) -> int:
    """``rnncc cache list|clear|prune``: see ``docs/cache.md``."""
    from rnncc.config import get_config
    from rnncc.runtime import cache

    root = get_config().cache_dir
    if args.action == "list":
        _print_entries(root, cache.list_entries(root))
        return 0
    if args.action == "clear":
        removed, kept = cache.clear(root, args.patterns)
    else:
        removed, kept = cache.prune(root, args.max_size)
    freed = cache.format_size(sum(e.size for e in removed))
    print(f"removed {_entries(len(removed))} ({freed}) from {root}")
    for entry in kept:
        print(f"kept {entry.path.name}: in use ({entry.in_use})")
    if args.action == "prune":
        print(f"the cache holds {cache.format_size(sum(e.size for e in cache.list_entries(root)))}")
    return 0


def _entries(n: int) -> str:
    return f"{n} entr{'y' if n == 1 else 'ies'}"


def _print_entries(root: Path, entries: list[Entry]) -> None:
    """The table of ``rnncc cache list``: entry folder, kernel, size, age, in use."""
    import time

    from rnncc.runtime import cache

    if not entries:
        print(f"kernel cache {root}: empty")
        return
    print(
        f"kernel cache {root}: {_entries(len(entries))}, "
        f"{cache.format_size(sum(e.size for e in entries))}"
    )
    now = time.time()
    rows = [("entry", "kernel", "size", "age", "in use")]
    for e in entries:
        kernel = e.manifest.description if e.manifest else "unfinished build"
        kernel = "unreadable manifest" if e.damaged else kernel
        age = cache.format_age(now - e.built_at)
        rows.append((e.path.name, kernel, cache.format_size(e.size), age, e.in_use))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


def _size(text: str) -> int:
    from rnncc.runtime.cache import parse_size

    try:
        return parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _named(text: str) -> str:
    """An argparse type for --arch and --device: an empty name would read as not given."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must name a GPU or an arch, got {text!r}")
    return text


def _folder(text: str) -> str:
    """An argparse type for -o: an empty path (an unset shell variable) would write into the
    current folder."""
    if not text:
        raise argparse.ArgumentTypeError(
            "the path is empty; name the package folder (-o . for here)"
        )
    return text


def _density(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a kept fraction in (0, 1], got {text!r}")
    return value


def _plan_for(cell: Cell, args: argparse.Namespace) -> Plan:
    """The plan for the sizes of ``rnncc plan`` / ``rnncc compile --hidden``: what the runtime
    launches for them on ``--arch`` (default: this GPU)."""
    from rnncc.dump import dump_plan
    from rnncc.tiling import Problem, caps_for_device, solve

    hidden, heads = args.hidden, args.heads
    if heads < 1 or hidden < 1 or hidden % heads:
        raise RnnccError(f"--hidden {hidden} is not a positive multiple of --heads {heads}")
    if args.batch < 1:
        raise RnnccError(f"--batch must be positive, got {args.batch}")
    if args.density < 1.0 and not cell.gr_names:
        raise RnnccError(
            f"--density {args.density:g}: cell '{cell.name}' has no R (no 'R h' term) to prune"
        )
    caps = _target_caps(args) or caps_for_device()
    problem = Problem.from_cell(
        cell,
        heads=heads,
        head_dim=hidden // heads,
        batch=args.batch,
        dtype=args.dtype,
        timeline=args.timeline,
        density=args.density,
    )
    plan = solve(problem, caps)
    dump_plan(cell.name, plan)
    return plan


def _plan_files(
    cell: Cell, args: argparse.Namespace
) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """plan.txt and plan.json for the sizes given, and the build records of the kernels the
    plan runs besides the stepwise ones (none when it runs those)."""
    import json

    from rnncc.errors import TilingError

    try:
        plan = _plan_for(cell, args)
    except TilingError as err:
        raise RnnccError(str(err)) from None
    files = {
        "plan.txt": plan.explain() + "\n",
        "plan.json": json.dumps(plan.as_dict(), indent=1) + "\n",
    }
    return files, [plan.build] if plan.fused else []


def cmd_plan(args: argparse.Namespace) -> int:
    """``rnncc plan``: the plan explained, or as JSON."""
    import json

    from rnncc.errors import TilingError

    cells, warns = _compile(args.file)
    _print_warnings(warns)
    cell = _pick(cells, args.cell, args.file)
    try:
        plan = _plan_for(cell, args)
    except TilingError as err:
        raise RnnccError(str(err)) from None
    print(json.dumps(plan.as_dict(), indent=2) if args.json else plan.explain())
    return 0


#: The defaults of a plan's sizes other than --hidden (``_size_arguments``).
_PLAN_DEFAULTS: dict[str, object] = {
    "heads": 1,
    "batch": 16,
    "dtype": "bf16",
    "timeline": False,
    "density": 1.0,
}


def _size_arguments(p: argparse.ArgumentParser, *, required: bool) -> None:
    """The sizes and target of a plan (``rnncc plan``; ``rnncc compile``, where --hidden is
    optional and asks for the planned kernels)."""
    what = "hidden size = heads × head dim" + (
        "" if required else ": write the plan and its kernels"
    )
    p.add_argument("--hidden", type=int, required=required, metavar="H", help=what)
    p.add_argument(
        "--heads", type=int, default=_PLAN_DEFAULTS["heads"], metavar="NH", help="heads (default 1)"
    )
    p.add_argument(
        "--batch", type=int, default=_PLAN_DEFAULTS["batch"], metavar="B", help="batch (default 16)"
    )
    p.add_argument(
        "--dtype",
        default=_PLAN_DEFAULTS["dtype"],
        choices=("bf16", "fp16", "fp32"),
        help="storage dtype",
    )
    p.add_argument(
        "--arch",
        type=_named,
        metavar="ARCH",
        help="target GPU: sm_90, h100, h100-pcie, h200, a100, l40s, ... (default: this GPU)",
    )
    p.add_argument(
        "--device",
        type=_named,
        metavar="NAME",
        help='target GPU by name, as torch reports it: "A100 80GB", "L40S", "RTX 4090", '
        '"H100 PCIe" (its SMs, shared memory, registers; with --arch, the two must agree)',
    )
    p.add_argument(
        "--timeline",
        action="store_true",
        help="the kernels of calls with per-row lengths or reversed (packed and bidirectional "
        "layers)",
    )
    p.add_argument(
        "--density",
        type=_density,
        default=_PLAN_DEFAULTS["density"],
        metavar="D",
        help="the kernels of calls with a mask= (a sparse R) keeping this fraction of R in its "
        "fullest strip of units (default 1: dense)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rnncc",
        description="A compiler for recurrent neural network cells written in .rnn files.",
    )
    parser.add_argument("--version", action="version", version=f"rnncc {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "check",
        help="parse and check .rnn files",
        description="Parse and check .rnn files; print every error and warning.",
    )
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("-q", "--quiet", action="store_true", help="print only diagnostics")
    p.set_defaults(func=cmd_check)

    p = sub.add_parser(
        "show",
        help="print a cell's IR in surface syntax",
        description="Print the checked, simplified IR of each cell in surface syntax, "
        "or with --backward the derived backward cell.",
    )
    p.add_argument("file", metavar="FILE")
    p.add_argument("--cell", metavar="NAME", help="only this cell of the file")
    p.add_argument("--backward", action="store_true", help="print the derived backward cell")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser(
        "compile",
        help="compile a cell into an importable Python package",
        description="Compile a cell into DIR, an importable Python package holding the cell's "
        "IR and backward IR: `import DIR; y, last = DIR.cell(Wx, R, b)`.",
    )
    p.add_argument("file", metavar="FILE")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="DIR",
        type=_folder,
        help="the package folder to write",
    )
    p.add_argument("--cell", metavar="NAME", help="the cell to compile when the file has several")
    _size_arguments(p, required=False)
    p.add_argument(
        "--prebuild",
        action="store_true",
        help="build the CUDA libraries into the cache now (needs nvcc and a CUDA build of torch)",
    )
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser(
        "cache",
        help="list, clear or prune the built-kernel cache",
        description="The cache of built kernels ($RNNCC_CACHE_DIR, default $XDG_CACHE_HOME/rnncc, else ~/.cache/rnncc). "
        "Entries in use (being built, or loaded by a running process) are never removed.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser(
        "list",
        help="each entry: kernel, size, age, in use",
        description="List the cache's entries: folder, kernel, size on disk, age, in use.",
    )
    q = actions.add_parser(
        "clear",
        help="remove all entries, or those matching globs",
        description="Remove every entry, or those whose folder or library name matches one "
        "of the globs (e.g. 'rnncc_lstm_*').",
    )
    q.add_argument("patterns", nargs="*", metavar="GLOB")
    q = actions.add_parser(
        "prune",
        help="remove least recently used entries down to a size",
        description="Remove unfinished builds, then the least recently used entries, until "
        "the cache holds at most SIZE.",
    )
    q.add_argument(
        "--max-size", type=_size, required=True, metavar="SIZE", help="e.g. 2G, 500M (binary)"
    )
    p.set_defaults(func=cmd_cache)

    p = sub.add_parser(
        "plan",
        help="print the plan: the kernel variant that runs a cell at given sizes",
        description="Solve for the kernel variant, its parameters and launch that run the cell "
        "at these sizes on the target GPU, and explain the choice: the predicted µs per step, "
        "the constraints that bind, the other variants' costs or why they are ruled out.",
    )
    p.add_argument("file", metavar="FILE")
    p.add_argument("--cell", metavar="NAME", help="the cell to plan when the file has several")
    _size_arguments(p, required=True)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=cmd_plan)

    from rnncc import bench

    bench.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except DslError as err:
        print(err, file=sys.stderr)
        return 1
    except RnnccError as err:
        print(f"rnncc: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `rnncc show f.rnn | head -1`: the reader has gone
        # Python's own exit flush would report the pipe again (its documented remedy)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):  # not the user's full disk: a bug
            raise
        where = f"{err.filename}: " if err.filename else ""
        print(f"rnncc: error: {where}cannot write: {err.strerror}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
