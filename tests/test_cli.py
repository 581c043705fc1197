"""The ``rnncc`` command: check, show, compile, their errors and help (``plan`` is tested
with the tiling package).

Most tests call ``rnncc.cli.main`` in-process and read stdout/stderr with ``capsys``; a few run
``python -m rnncc`` as a subprocess to prove that a user error prints no traceback, and one
imports a compiled package in a fresh interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rnncc
from rnncc.cli import main
from rnncc.frontend import compile_source

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "examples").glob("*.rnn"))
SUBCOMMANDS = ("check", "show", "compile")

# Two errors on one line (both reported), positions as the user counts them.
BAD = """cell bad(h) {
    gates a = W x + R h + b
    h = tanh(a + q) * p
}
"""
BAD_DIAGNOSTICS = """{path}:3:18: error: unknown name 'q'
        h = tanh(a + q) * p
                     ^
{path}:3:23: error: unknown name 'p'
        h = tanh(a + q) * p
                          ^
"""


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    """``main(argv)``; returns (exit status, stdout, stderr)."""
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as exit_:  # argparse: --help, --version, usage errors
        rc = exit_.code if isinstance(exit_.code, int) else 1
    out, err = capsys.readouterr()
    return rc, out, err


def run_subprocess(*argv: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    return subprocess.run(
        [sys.executable, *map(str, argv)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def bad(tmp_path: Path) -> Path:
    path = tmp_path / "bad.rnn"
    path.write_text(BAD)
    return path


@pytest.fixture
def two(tmp_path: Path) -> Path:
    """A file with two cells, elman and indrnn."""
    path = tmp_path / "two.rnn"
    path.write_text(
        (REPO / "examples/elman.rnn").read_text() + (REPO / "examples/indrnn.rnn").read_text()
    )
    return path


# ---- check -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_check_every_example(capsys, path: Path) -> None:
    rc, out, err = run(capsys, "check", path)
    assert (rc, err) == (0, "")
    assert out == f"{path}: ok (1 cell: {path.stem})\n"


def test_check_all_examples_at_once_and_quiet(capsys) -> None:
    rc, out, err = run(capsys, "check", *EXAMPLES)
    assert (rc, err) == (0, "")
    assert out.splitlines() == [f"{p}: ok (1 cell: {p.stem})" for p in EXAMPLES]
    assert run(capsys, "check", "-q", *EXAMPLES) == (0, "", "")


def test_check_bad_file(capsys, bad: Path) -> None:
    rc, out, err = run(capsys, "check", bad)
    assert (rc, out) == (1, "")
    assert err == BAD_DIAGNOSTICS.format(path=bad)


def test_check_several_files_one_bad(capsys, bad: Path, two: Path) -> None:
    lstm = REPO / "examples/lstm.rnn"
    rc, out, err = run(capsys, "check", lstm, bad, two)
    assert rc == 1
    assert out == f"{lstm}: ok (1 cell: lstm)\n{two}: ok (2 cells: elman, indrnn)\n"
    assert err == BAD_DIAGNOSTICS.format(path=bad)


def test_check_prints_warnings_and_succeeds(capsys, tmp_path: Path) -> None:
    path = tmp_path / "warn.rnn"
    path.write_text("cell w(h) {\n    gates a, unused = W x + R h + b\n    h = tanh(a)\n}\n")
    rc, out, err = run(capsys, "check", path)
    assert rc == 0
    assert out == f"{path}: ok (1 cell: w)\n"
    assert err == (
        f"{path}:2:14: warning: gate 'unused' is never used\n"
        "        gates a, unused = W x + R h + b\n"
        "                 ^~~~~~\n"
    )


def test_check_syntax_error(capsys, tmp_path: Path) -> None:
    path = tmp_path / "syntax.rnn"
    path.write_text("cell oops(h) {\n    gates a = W x +\n}\n")
    rc, out, err = run(capsys, "check", path)
    assert (rc, out) == (1, "")
    assert err.startswith(f"{path}:2:20: error: ")
    assert err.splitlines()[1:] == ["        gates a = W x +", "                       ^"]


def test_check_bad_file_subprocess_prints_no_traceback(bad: Path, tmp_path: Path) -> None:
    proc = run_subprocess("-m", "rnncc", "check", bad, REPO / "examples/gru.rnn", cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stdout == f"{REPO / 'examples/gru.rnn'}: ok (1 cell: gru)\n"
    assert proc.stderr == BAD_DIAGNOSTICS.format(path=bad)
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_output_to_a_full_disk_is_one_line(tmp_path: Path) -> None:
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [sys.executable, "-m", "rnncc", "show", str(REPO / "examples/gru.rnn")],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
        )
    assert (proc.returncode, proc.stderr) == (
        1,
        "rnncc: error: cannot write: No space left on device\n",
    )


def test_output_into_a_closed_pipe_is_quiet(capsys, monkeypatch) -> None:
    """`rnncc show ... | head -1`: the reader leaves early; no traceback, no message, and the
    output's descriptor points at /dev/null so that Python's exit flush stays quiet too."""
    read, write = os.pipe()
    os.close(read)

    class Closed:
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self) -> int:
            return write

    monkeypatch.setattr(sys, "stdout", Closed())
    try:
        assert main(["show", str(REPO / "examples/gru.rnn")]) == 1
        assert os.write(write, b"x") == 1  # /dev/null now, not the closed pipe
    finally:
        os.close(write)
    assert capsys.readouterr().err == ""


def test_missing_file(capsys, tmp_path: Path) -> None:
    missing = tmp_path / "missing.rnn"
    rc, out, err = run(capsys, "check", missing)
    assert (rc, out) == (1, "")
    assert err == f"rnncc: error: {missing}: cannot read: No such file or directory\n"
    for command in (
        ["show", missing],
        ["compile", missing, "-o", tmp_path / "pkg"],
        ["bench", missing, "--hidden", "8"],  # bench printed it without "rnncc: error:"
    ):
        assert run(capsys, *command) == (1, "", err)
    assert not (tmp_path / "pkg").exists()


def test_check_goes_on_after_an_unreadable_file(capsys, tmp_path: Path) -> None:
    missing, binary = tmp_path / "missing.rnn", tmp_path / "binary.rnn"
    binary.write_bytes(b"\xff\xfe\x00cell")
    gru = REPO / "examples/gru.rnn"
    rc, out, err = run(capsys, "check", missing, binary, gru)
    assert rc == 1
    assert out == f"{gru}: ok (1 cell: gru)\n"
    assert err == (
        f"rnncc: error: {missing}: cannot read: No such file or directory\n"
        f"rnncc: error: {binary}: cannot read: not UTF-8 text (invalid start byte at byte 0)\n"
    )


# ---- show --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_show_compiles_back_to_an_equal_cell(capsys, path: Path) -> None:
    rc, out, err = run(capsys, "show", path)
    assert (rc, err) == (0, "")
    assert out.startswith(f"cell {path.stem}(")
    (original,), _ = compile_source(path.read_text(), str(path))
    (shown,), warnings = compile_source(out, "<shown>")
    assert shown == original
    assert warnings == []


def test_show_backward(capsys) -> None:
    rc, out, err = run(capsys, "show", REPO / "examples/gru.rnn", "--backward")
    assert (rc, err) == (0, "")
    assert "backward gru {\n" in out
    assert out == rnncc.load(REPO / "examples/gru.rnn").backward_source()
    # one cotangent per old state, gate and param
    for name in ("dh", "dxr", "dxz", "dxn", "dhr", "dhz", "dhn"):
        assert f"\n    {name} = " in out


def test_show_backward_with_params(capsys) -> None:
    rc, out, _ = run(capsys, "show", "--backward", REPO / "examples/peephole_lstm.rnn")
    assert rc == 0
    assert "backward peephole_lstm {\n" in out
    for name in ("dh", "dc", "di", "df", "dz", "do", "dp_i", "dp_f", "dp_o"):
        assert f"\n    {name} = " in out


def test_show_several_cells_and_cell_selection(capsys, two: Path) -> None:
    rc, out, err = run(capsys, "show", two)
    assert (rc, err) == (0, "")
    cells, _ = compile_source(out)
    assert [c.name for c in cells] == ["elman", "indrnn"]

    rc, out, err = run(capsys, "show", two, "--cell", "indrnn")
    assert (rc, err) == (0, "")
    (shown,), _ = compile_source(out)
    assert shown == rnncc.load(two, cell="indrnn").ir

    rc, out, err = run(capsys, "show", two, "--cell", "indrnn", "--backward")
    assert rc == 0
    assert "backward indrnn {" in out and "elman" not in out


def test_show_unknown_cell_lists_the_cells(capsys, two: Path) -> None:
    rc, out, err = run(capsys, "show", two, "--cell", "nope")
    assert (rc, out) == (1, "")
    assert err == f"rnncc: error: {two} has no cell named 'nope'; it defines: elman, indrnn\n"


def test_show_bad_file(capsys, bad: Path) -> None:
    assert run(capsys, "show", bad) == (1, "", BAD_DIAGNOSTICS.format(path=bad))


# ---- compile -----------------------------------------------------------------------------


def test_compile_bad_file_writes_nothing(capsys, bad: Path, tmp_path: Path) -> None:
    out_dir = tmp_path / "out"
    before = sorted(tmp_path.iterdir())
    assert run(capsys, "compile", bad, "-o", out_dir) == (1, "", BAD_DIAGNOSTICS.format(path=bad))
    assert sorted(tmp_path.iterdir()) == before


def test_compile_plan_sizes_need_hidden(capsys, tmp_path: Path) -> None:
    """--heads and its kin were ignored without --hidden: the package came out without the
    kernels they asked for."""
    lstm = REPO / "examples" / "lstm.rnn"
    argv = ("compile", lstm, "-o", tmp_path / "pkg", "--heads", "4", "--timeline")
    assert run(capsys, *argv) == (
        1,
        "",
        "rnncc: error: --heads, --timeline size the planned kernels, which need --hidden H "
        "(without it the package holds the cell and its stepwise kernels only)\n",
    )
    assert not (tmp_path / "pkg").exists()


def test_compile_several_cells_needs_cell(capsys, two: Path, tmp_path: Path) -> None:
    rc, out, err = run(capsys, "compile", two, "-o", tmp_path / "pkg")
    assert (rc, out) == (1, "")
    assert err == (
        f"rnncc: error: {two} defines several cells (elman, indrnn); choose one with --cell NAME\n"
    )
    rc, out, err = run(capsys, "compile", two, "-o", tmp_path / "pkg", "--cell", "nope")
    assert (rc, out) == (1, "")
    assert err == f"rnncc: error: {two} has no cell named 'nope'; it defines: elman, indrnn\n"
    assert not (tmp_path / "pkg").exists()

    rc, out, err = run(capsys, "compile", two, "-o", tmp_path / "pkg", "--cell", "indrnn")
    assert (rc, err) == (0, "")
    assert out == (
        f"wrote {tmp_path / 'pkg'} (cell 'indrnn'); import it with the parent folder on sys.path\n"
    )
    assert sorted(p.name for p in (tmp_path / "pkg").iterdir()) == [
        ".rnncc-package.json",
        "__init__.py",
        "cell.json",
        "cell.rnn",
        "kernels",
    ]
    kernels = sorted(p.name for p in (tmp_path / "pkg" / "kernels").iterdir())
    assert kernels == [
        "decode.cuh",
        "indrnn_stepwise.cu",
        "rnncc_abi.h",
        "rnncc_mma.cuh",
        "rnncc_ops.cuh",
        "stepwise.cuh",
        "timeline.cuh",
    ]


def test_compile_writes_the_plan_and_the_kernels_it_runs(capsys, tmp_path: Path) -> None:
    import json

    from rnncc.tiling import Problem
    from rnncc.variants import BY_NAME

    args = ["compile", str(REPO / "examples" / "lstm.rnn"), "-o", str(tmp_path / "pkg")]
    rc = main([*args, "--hidden", "768", "--heads", "12", "--arch", "sm_90"])
    assert rc == 0
    plan = json.loads((tmp_path / "pkg" / "plan.json").read_text())
    assert plan["variant"] == "block_mma" and plan["launch"]["forward"]["grid"] == [12, 2, 1]
    text = (tmp_path / "pkg" / "plan.txt").read_text()
    assert text.startswith("plan for Gr=4, NH=12, D=64, B=16, bf16 on NVIDIA H100 SXM")
    # The package holds the planned kernels (and the stepwise ones): the sources that run.
    cell = rnncc.load(REPO / "examples" / "lstm.rnn")
    problem = Problem.from_cell(cell.ir, heads=12, head_dim=64, batch=16)
    for name in ("stepwise", "block_mma"):
        src = BY_NAME[name].render(cell.ir, cell.backward_ir, BY_NAME[name].build(problem))
        assert (tmp_path / "pkg" / "kernels" / src.filename).read_text() == src.text
    assert plan["build"] == BY_NAME["block_mma"].build(problem)
    # A size no fused variant runs plans the stepwise kernels and ships only those.
    rc = main([*args, "--hidden", "8192", "--arch", "h100"])
    assert rc == 0
    assert json.loads((tmp_path / "pkg" / "plan.json").read_text())["variant"] == "stepwise"
    kernels = sorted(p.name for p in (tmp_path / "pkg" / "kernels").glob("*.cu"))
    assert kernels == ["lstm_stepwise.cu"]


def test_plan_explains_the_variant_and_its_launch(capsys) -> None:
    lstm = REPO / "examples" / "lstm.rnn"
    rc, out, err = run(capsys, "plan", lstm, "--hidden", "768", "--batch", "64", "--arch", "h100")
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == "plan for Gr=4, NH=1, D=768, B=64, bf16 on NVIDIA H100 SXM (sm_90, 132 SMs)"
    assert lines[1].startswith("  variant     grid_mma: mma.sync grid tier")
    assert "  parameters  n_tiles = 4, unit_tiles = 2, blocks_per_sm = 1" in lines
    assert (
        "  forward     kernel 3: 48×1×2 blocks of 384 threads, 98304 B dynamic shared memory"
        in lines
    )
    assert any(line.startswith("  other       stepwise: feasible") for line in lines)
    assert any(
        line.startswith("  other       block_mma: ruled out by block_warps") for line in lines
    )
    rc, out, err = run(
        capsys, "plan", lstm, "--hidden", "64", "--dtype", "fp32", "--json", "--arch", "h100"
    )
    assert rc == 0 and '"variant": "block_ffma"' in out
    rc, out, err = run(
        capsys, "plan", lstm, "--hidden", "64", "--timeline", "--json", "--arch", "h100"
    )
    assert rc == 0 and '"timeline": true' in out and '"variant": "block_mma"' in out
    rc, out, err = run(capsys, "plan", lstm, "--hidden", "768", "--timeline", "--arch", "h100")
    assert out.splitlines()[0].endswith(
        "bf16, per-row lengths or reversed on NVIDIA H100 SXM (sm_90, 132 SMs)"
    )


def test_plan_of_a_streaming_head_names_its_l2_window(capsys) -> None:
    lstm = REPO / "examples" / "lstm.rnn"
    rc, out, err = run(capsys, "plan", lstm, "--hidden", "4096", "--batch", "4", "--arch", "h100")
    assert (rc, err) == (0, "")
    assert out.splitlines()[1].startswith("  variant     grid_stream:")
    window = [line for line in out.splitlines() if line.startswith("  L2 window")]
    assert window == [
        "  L2 window   104857600 B of the streamed R (the buffer's words from 131076) kept in L2 "
        "across steps (persisting lines: 0.85 of L2's set-aside forward, 0.3 backward)"
    ]
    rc, out, err = run(capsys, "plan", lstm, "--hidden", "2048", "--batch", "4", "--arch", "h100")
    assert rc == 0 and "L2 window" not in out  # R on chip: nothing streamed


def test_plan_of_a_sparse_r(capsys) -> None:
    lstm = REPO / "examples" / "lstm.rnn"
    args = ["plan", lstm, "--hidden", "2304", "--batch", "4", "--arch", "h100"]
    rc, out, err = run(capsys, *args, "--density", "0.3")
    assert (rc, err) == (0, "")
    assert out.splitlines()[0].startswith("plan for Gr=4, NH=1, D=2304, B=4, bf16, R 30.0% dense")
    assert out.splitlines()[1].startswith("  variant     grid_sparse:")
    rc, out, err = run(capsys, *args, "--density", "0.6")  # past what the blocks hold
    assert rc == 0 and "grid_sparse: ruled out by entries_fit_on_chip" in out
    for bad in ("0", "1.5", "half"):
        rc, out, err = run(capsys, *args, "--density", bad)
        assert rc == 2 and f"--density: must be a kept fraction in (0, 1], got '{bad}'" in err


def test_plan_usage_errors(capsys) -> None:
    lstm = REPO / "examples" / "lstm.rnn"
    rc, out, err = run(capsys, "plan", lstm, "--hidden", "100", "--heads", "3", "--arch", "h100")
    assert (rc, out) == (1, "")
    assert err == "rnncc: error: --hidden 100 is not a positive multiple of --heads 3\n"
    rc, out, err = run(capsys, "plan", lstm, "--hidden", "64", "--arch", "z80")
    assert rc == 1 and err.startswith("rnncc: error: ") and "z80" in err


@pytest.mark.parametrize("cell", ["lru", "mingru", "minlstm", "indrnn", "sru"])
def test_plan_density_needs_an_r_to_prune(capsys, tmp_path: Path, cell: str) -> None:
    path = REPO / "examples" / f"{cell}.rnn"
    sizes = ["--hidden", "64", "--arch", "h100", "--density", "0.5"]
    message = f"rnncc: error: --density 0.5: cell '{cell}' has no R (no 'R h' term) to prune\n"
    assert run(capsys, "plan", path, *sizes) == (1, "", message)
    assert run(capsys, "compile", path, "-o", tmp_path / "pkg", *sizes) == (1, "", message)
    assert not (tmp_path / "pkg").exists()
    rc, _, err = run(capsys, "plan", path, "--hidden", "64", "--arch", "h100")  # dense: fine
    assert (rc, err) == (0, "")


@pytest.mark.parametrize("command", ["plan", "compile"])
@pytest.mark.parametrize("option", ["--arch", "--device"])
@pytest.mark.parametrize("value", ["", " "])
def test_empty_target_is_refused(capsys, tmp_path: Path, command, option, value) -> None:
    argv = [command, REPO / "examples" / "lstm.rnn", "--hidden", "64", option, value]
    argv += ["-o", tmp_path / "pkg"] if command == "compile" else []
    rc, out, err = run(capsys, *argv)
    assert (rc, out) == (2, "")
    assert err.splitlines()[-1] == (
        f"rnncc {command}: error: argument {option}: must name a GPU or an arch, got {value!r}"
    )


def test_an_empty_output_folder_is_refused(capsys, tmp_path: Path, monkeypatch) -> None:
    """``-o ""`` (an unset shell variable) would write the package into the current folder."""
    monkeypatch.chdir(tmp_path)
    rc, out, err = run(capsys, "compile", REPO / "examples" / "lstm.rnn", "-o", "")
    assert (rc, out) == (2, "")
    assert err.splitlines()[-1] == (
        "rnncc compile: error: argument -o/--output: the path is empty; name the package "
        "folder (-o . for here)"
    )
    assert not any(tmp_path.iterdir())


def test_plan_json_carries_the_note_on_other_dtypes(capsys) -> None:
    """The text's line on the variants that do not store the dtype is in the JSON too."""
    import json

    argv = ["plan", REPO / "examples" / "lstm.rnn", "--hidden", "64", "--arch", "h100"]
    note = "block_ffma: store fp32 only, not bf16"
    rc, out, _ = run(capsys, *argv)
    assert rc == 0 and f"  other       {note}" in out.splitlines()
    rc, out, _ = run(capsys, *argv, "--json")
    assert rc == 0 and json.loads(out)["other_dtypes"] == [note]


@pytest.mark.parametrize(
    ("device", "arch", "header"),
    [
        ("A100 80GB", "sm_80", "on NVIDIA A100 (sm_80, 108 SMs)"),
        ("L40S", "sm_89", "on NVIDIA L40S (sm_89, 142 SMs)"),
        ("NVIDIA GeForce RTX 4090", "sm_89", "on NVIDIA GeForce RTX 4090 (sm_89, 128 SMs)"),
        ("H100 PCIe", "sm_90", "on NVIDIA H100 PCIe (sm_90, 114 SMs)"),
    ],
)
def test_plan_for_a_named_device_reads_its_caps(capsys, device, arch, header) -> None:
    lstm = REPO / "examples" / "lstm.rnn"
    for extra in ([], ["--arch", arch]):
        rc, out, err = run(capsys, "plan", lstm, "--hidden", "768", "--device", device, *extra)
        assert (rc, err) == (0, "")
        assert out.splitlines()[0].endswith(header), out.splitlines()[0]


def test_plan_device_and_arch_must_agree(capsys) -> None:
    lstm = REPO / "examples" / "lstm.rnn"
    rc, out, err = run(capsys, "plan", lstm, "--hidden", "64", "--device", "L40S", "--arch", "a100")
    assert (rc, out) == (1, "")
    assert err == (
        "rnncc: error: --device 'L40S' is an sm_89 GPU (NVIDIA L40S), but --arch 'a100' is sm_80\n"
    )
    rc, out, err = run(capsys, "plan", lstm, "--hidden", "64", "--device", "Voodoo 5")
    assert rc == 1 and err.startswith("rnncc: error: unknown GPU or arch 'Voodoo 5'")


def test_compile_prebuild_without_gpu_needs_arch(capsys, tmp_path: Path, monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    # Past the checks that come first: a CUDA build of torch, nvcc, a writable cache.
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr("torch.utils.cpp_extension.CUDA_HOME", "/usr/local/cuda")
    monkeypatch.setenv("RNNCC_CACHE_DIR", str(tmp_path / "cache"))
    rc = main(
        ["compile", str(REPO / "examples" / "lstm.rnn"), "-o", str(tmp_path / "pkg"), "--prebuild"]
    )
    assert rc == 1
    assert "name the target with --arch" in capsys.readouterr().err


def test_compile_refuses_unusable_output(capsys, tmp_path: Path) -> None:
    lstm = REPO / "examples/lstm.rnn"
    rc, out, err = run(capsys, "compile", lstm, "-o", tmp_path / "my-pkg")
    assert (rc, out) == (1, "")
    assert err == (
        f"rnncc: error: {tmp_path / 'my-pkg'}: a package folder needs a Python identifier as "
        "its name (its import name), not 'my-pkg'\n"
    )
    # A folder of the user's own files is never replaced.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    rc, out, err = run(capsys, "compile", lstm, "-o", mine)
    assert (rc, out) == (1, "")
    assert err == (
        f"rnncc: error: {mine} exists and is not an rnncc package (no .rnncc-package.json): "
        "not writing into it; choose another folder or remove it\n"
    )
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    # An output below a file cannot be written: an error, not a traceback.
    (tmp_path / "afile").write_text("")
    rc, out, err = run(capsys, "compile", lstm, "-o", tmp_path / "afile" / "pkg")
    assert (rc, out) == (1, "")
    assert err.startswith(f"rnncc: error: {tmp_path / 'afile' / 'pkg'}: cannot write: ")


_IMPORT_AND_RUN = """
import sys
import torch
import rnncc.runtime.api as api

def refuse(*args, **kwargs):
    raise AssertionError("importing a compiled package ran the front end or autodiff")

api.compile_source = api.derive_backward = refuse
sys.path.insert(0, sys.argv[1])
import {package} as pkg

inputs = torch.load(sys.argv[2])
grads = {{k: v.requires_grad_() for k, v in inputs.items() if k != "cotangents"}}
y, last = pkg.cell(**grads)
dy, dlast = inputs["cotangents"]
((y * dy).sum() + (last * dlast).sum()).backward()
torch.save({{"y": y, "last": last, **{{k: v.grad for k, v in grads.items()}}}}, sys.argv[3])
print(pkg.cell.name, pkg.cell.last_backend)
"""


def test_compile_package_imports_in_a_fresh_interpreter(capsys, tmp_path: Path) -> None:
    src = REPO / "examples/peephole_lstm.rnn"  # R, b, params and two outputs
    rc, _, err = run(capsys, "compile", src, "-o", tmp_path / "pkgs" / "peephole")
    assert (rc, err) == (0, "")

    cell = rnncc.load(src)
    B, T, NH, D = 2, 5, 2, 3
    shapes = cell.shapes(B, T, NH, D)
    gen = torch.Generator().manual_seed(0)
    inputs = {
        name: torch.randn(shapes[name], generator=gen, dtype=torch.float64)
        for name in ("Wx", "R", "b", "states", "params")
    }
    cotangents = (
        torch.randn(shapes["y"], generator=gen, dtype=torch.float64),
        torch.randn(shapes["last"], generator=gen, dtype=torch.float64),
    )
    torch.save({**inputs, "cotangents": cotangents}, tmp_path / "in.pt")

    script = tmp_path / "run_package.py"
    script.write_text(_IMPORT_AND_RUN.format(package="peephole"))
    proc = run_subprocess(
        script, tmp_path / "pkgs", tmp_path / "in.pt", tmp_path / "out.pt", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "peephole_lstm reference\n"

    got = torch.load(tmp_path / "out.pt")
    leaves = {k: v.clone().requires_grad_() for k, v in inputs.items()}
    y, last = cell(**leaves)
    ((y * cotangents[0]).sum() + (last * cotangents[1]).sum()).backward()
    assert torch.equal(got["y"], y) and torch.equal(got["last"], last)
    for name, leaf in leaves.items():
        assert torch.equal(got[name], leaf.grad), name


# ---- help and version --------------------------------------------------------------------


def test_help(capsys) -> None:
    rc, out, err = run(capsys, "--help")
    assert (rc, err) == (0, "")
    assert out.startswith("usage: rnncc ")
    for command in SUBCOMMANDS:
        assert command in out


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_subcommand_help(capsys, command: str) -> None:
    rc, out, err = run(capsys, command, "--help")
    assert (rc, err) == (0, "")
    assert out.startswith(f"usage: rnncc {command} ")


def test_version(capsys) -> None:
    assert run(capsys, "--version") == (0, f"rnncc {rnncc.__version__}\n", "")


def test_usage_errors_exit_2(capsys) -> None:
    rc, out, err = run(capsys)
    assert (rc, out) == (2, "")
    assert err.endswith("rnncc: error: the following arguments are required: COMMAND\n")
    rc, out, err = run(capsys, "check")
    assert (rc, out) == (2, "")
    assert err.endswith("rnncc check: error: the following arguments are required: FILE\n")
    rc, _, err = run(capsys, "compile", REPO / "examples/lstm.rnn")
    assert rc == 2
    assert err.endswith("the following arguments are required: -o/--output\n")


def test_python_m_rnncc_help_and_version(tmp_path: Path) -> None:
    proc = run_subprocess("-m", "rnncc", "--version", cwd=tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, f"rnncc {rnncc.__version__}\n", "")
