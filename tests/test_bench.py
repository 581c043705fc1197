"""``rnncc bench`` and the benchmark scripts, on the CPU: the timing statistics on a fake
timer, input rotation, the record schema, unavailable and failing systems, baseline detection,
the CLI at a tiny size (the reference loop), the suite's plan, and the report's Markdown,
README block and plots from a small synthetic results file."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from rnncc import bench
from rnncc.bench import Case, Record, Settings, Stats
from rnncc.cli import main
from rnncc.errors import RnnccError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(
        f"bench_{name}", ROOT / "benchmarks" / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def report():
    return _script("report")


@pytest.fixture
def cpu_only(monkeypatch):
    """Run as on a machine without CUDA, even on a GPU machine."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


# ---- statistics, timing, rotation --------------------------------------------------------


def test_stats_median_quartiles_and_range():
    s = Stats.of([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.median, s.q1, s.q3, s.min, s.max, s.n) == (3.0, 2.0, 4.0, 1.0, 5.0, 5)
    one = Stats.of([7.5])
    assert (one.median, one.q1, one.q3, one.min, one.max) == (7.5,) * 5
    with pytest.raises(ValueError, match="no timed calls"):
        Stats.of([])


def test_measure_excludes_warmup_rotates_sets_and_resets_untimed():
    times = iter([100.0, 90.0, 3.0, 1.0, 2.0, 4.0])  # two warm-up calls, then four timed
    events: list[str] = []

    def timer(fn):
        events.append("start")
        fn()
        return next(times)

    stats = bench.measure(
        lambda k: events.append(f"run{k}"),
        n_sets=3,
        warmup=2,
        repeats=4,
        timer=timer,
        reset=lambda: events.append("reset"),
    )
    assert (stats.median, stats.min, stats.max, stats.n) == (2.5, 1.0, 4.0, 4)
    runs = [e for e in events if e.startswith("run")]
    assert runs == ["run0", "run1", "run2", "run0", "run1", "run2"]
    # the reset comes before the timer starts: it is never inside the timed region
    assert events[:3] == ["reset", "start", "run0"]
    with pytest.raises(ValueError):
        bench.measure(lambda k: None, n_sets=1, warmup=0, repeats=0, timer=bench.host_timer)


def test_input_sets_rotate_only_below_twice_l2():
    l2 = 50 * 2**20
    assert bench.input_sets(2 * l2, l2) == 1
    assert bench.input_sets(10 * l2, l2) == 1
    assert bench.input_sets(l2, l2) == 2
    assert bench.input_sets(30 * 2**20, l2) == 4  # 4 × 30 MiB ≥ 100 MiB
    assert bench.input_sets(1024, l2) == bench.MAX_INPUT_SETS
    assert bench.input_sets(1024, l2, max_sets=3) == 3


# ---- records and systems -----------------------------------------------------------------


def test_record_schema_and_results_file(tmp_path):
    case = Case("lstm", 16, 1024, 12, 64, "bf16")
    r = Record.for_case("rnncc-stepwise", case)
    r.set_stats("fw", Stats.of([1.0, 2.0, 3.0]))
    d = r.as_dict()
    required = {"system", "cell", "dtype", "B", "T", "NH", "D", "fw_ms", "fwbw_ms"}
    assert required <= d.keys()
    assert (d["fw_ms"], d["fwbw_ms"], d["fw_iqr_ms"], d["fw_range_ms"]) == (
        2.0,
        None,
        [1.5, 2.5],
        [1.0, 3.0],
    )
    out = tmp_path / "r.json"
    bench.write_results(out, {"gpu": None}, [r], protocol={"repeats": 3})
    data = json.loads(out.read_text())
    assert data["machine"] == {"gpu": None} and data["records"] == [d]
    assert bench.gpu_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert bench.gpu_slug(None) == "cpu"


def test_record_problem_fields_are_written_beside_the_schema_s():
    case = Case("lstm", 16, 1024, 1, 768, "bf16")
    d = Record.for_case("x", case, problem={"num_layers": 2, "packed": "given"}).as_dict()
    assert (d["num_layers"], d["packed"], d["D"]) == (2, "given", 768) and "problem" not in d
    with pytest.raises(ValueError, match=r"\['D'\] are the record's own"):
        Record.for_case("x", case, problem={"D": 64}).as_dict()


@pytest.mark.parametrize(
    ("head", "diff", "expected"),
    [(0, 0, "abc123"), (0, 1, "abc123-dirty"), (128, 0, None)],
)
def test_a_record_names_a_tree_that_differs_from_head_dirty(monkeypatch, head, diff, expected):
    import subprocess

    from rnncc.bench import records

    def run(args, **kw):
        rc = head if "rev-parse" in args else diff
        return subprocess.CompletedProcess(args, rc, "abc123\n" if rc == 0 else "", "")

    monkeypatch.setattr(records.subprocess, "run", run)
    assert records._git_commit() == expected


def test_baseline_detection_lstm_gru_not_slstm():
    import rnncc

    assert bench.detect_baseline(rnncc.load(EXAMPLES / "lstm.rnn").ir) == "lstm"
    assert bench.detect_baseline(rnncc.load(EXAMPLES / "gru.rnn").ir) == "gru"
    assert bench.detect_baseline(rnncc.load(EXAMPLES / "slstm.rnn").ir) is None
    renamed = (EXAMPLES / "lstm.rnn").read_text().replace("cell lstm(", "cell my_lstm(")
    assert bench.detect_baseline(rnncc.loads(renamed).ir) == "lstm"
    assert bench.detect_baseline(rnncc.load(EXAMPLES / "lstm.rnn").ir, ROOT / "nowhere") is None


def test_unavailable_and_failing_systems_become_records(monkeypatch):
    import rnncc

    cell = rnncc.load(EXAMPLES / "lstm.rnn")
    case = Case("lstm", 2, 3, 1, 4, "fp32")

    def no_fused_kernel(*args, **kwargs):
        raise rnncc.TilingError("cell 'lstm': no fused kernel for head dim 4: (test)")

    monkeypatch.setattr(cell, "_choose", no_fused_kernel)
    fused = bench.time_workload(
        "rnncc-fused",
        lambda: bench.cell_workload(cell, case, "fused", "cpu"),
        case,
        device="cpu",
        fwbw=True,
        warmup=0,
        repeats=1,
    )
    assert fused.status == "unavailable" and "fused" in fused.note and fused.fw_ms is None

    def broken():
        raise RuntimeError("CUDA out of memory\nmore")

    failed = bench.time_workload(
        "rnncc-stepwise", broken, case, device="cpu", fwbw=True, warmup=0, repeats=1
    )
    assert failed.status == "failed" and failed.note == "setup: RuntimeError: CUDA out of memory"
    settings = Settings(warmup=0, repeats=1)
    on_cpu = bench.run_system("rnncc-stepwise", cell, case, device="cpu", settings=settings)
    assert [(r.status, r.note) for r in on_cpu] == [("unavailable", "needs CUDA")]
    slstm = rnncc.load(EXAMPLES / "slstm.rnn")
    none = bench.run_system("cudnn", slstm, case, device="cpu", settings=settings)
    assert none[0].status == "unavailable" and "--baseline" in none[0].note
    cudnn = bench.run_system("cudnn", cell, case, device="cpu", settings=settings, baseline="lstm")
    assert [(r.status, r.note) for r in cudnn] == [("unavailable", "needs CUDA")]


@pytest.mark.parametrize("system", ["torch-loop", "rnncc-reference-module", "cudnn"])
def test_every_workload_runs_fw_and_fwbw(system):
    """The workloads' closures, on the CPU (cuDNN's module runs there without cuDNN)."""
    import rnncc

    cell = rnncc.load(EXAMPLES / "gru.rnn")
    case = Case("gru", 2, 3, 2, 4, "fp32")
    builders = {
        "torch-loop": lambda: bench.cell_workload(cell, case, "reference", "cpu"),
        "rnncc-reference-module": lambda: bench.module_workload(cell, case, "reference", "cpu"),
        "cudnn": lambda: bench.cudnn_workload("gru", case, "cpu"),
    }
    r = bench.time_workload(
        system, builders[system], case, device="cpu", fwbw=True, warmup=1, repeats=2
    )
    assert r.status == "ok", r.note
    assert r.fw_ms > 0 and r.fwbw_ms > 0 and r.first_call_s > 0
    assert r.input_sets == bench.MAX_INPUT_SETS  # tiny inputs: rotated
    assert r.fw_iqr_ms[0] <= r.fw_ms <= r.fw_iqr_ms[1]


def test_parse_systems():
    assert bench.parse_systems(None) == list(bench.DEFAULT_SYSTEMS)
    assert bench.parse_systems("cudnn, torch-loop,cudnn") == ["cudnn", "torch-loop"]
    assert bench.parse_systems(["rnncc-reference-module"]) == ["rnncc-reference-module"]
    with pytest.raises(RnnccError, match="unknown system 'flashrnn'"):
        bench.parse_systems("flashrnn")


# ---- the command -------------------------------------------------------------------------


def test_cli_on_cpu_times_the_reference_loop(cpu_only, tmp_path, capsys):
    out = tmp_path / "b.json"
    argv = ["bench", str(EXAMPLES / "lstm.rnn"), "--hidden", "8", "--heads", "2", "--batch", "2"]
    argv += ["--seq", "3", "--backward", "--repeats", "2", "--warmup", "1", "--json", str(out)]
    assert main(argv) == 0
    cap = capsys.readouterr()
    assert "CUDA is not available" in cap.err and "[6/6] torch-loop" in cap.err
    assert "lstm B=2 T=3 2×4 fp32" not in cap.out  # the default dtype is bf16
    lines = cap.out.splitlines()
    assert lines[1].split()[:4] == ["system", "dtype", "fw", "ms"]
    loop = next(line for line in lines if line.startswith("torch-loop"))
    assert "—" not in loop.split("  ")[2]  # fw measured
    stepwise = next(line for line in lines if line.startswith("rnncc-stepwise "))
    assert "unavailable: needs CUDA" in stepwise
    data = json.loads(out.read_text())
    assert data["machine"]["gpu"] is None and data["load_s"] >= 0
    (rec,) = [r for r in data["records"] if r["system"] == "torch-loop"]
    assert rec["status"] == "ok" and rec["fw_ms"] > 0 and rec["fwbw_ms"] > 0
    assert (rec["B"], rec["T"], rec["NH"], rec["D"], rec["dtype"]) == (2, 3, 2, 4, "bf16")
    assert rec["repeats"] == 3  # --loop-repeats, the loop's own default


def test_cli_refuses_when_the_loop_would_take_too_long(cpu_only, capsys):
    argv = ["bench", str(EXAMPLES / "gru.rnn"), "--hidden", "64", "--seq", "512"]
    assert main([*argv, "--systems", "torch-loop", "--max-loop-seconds", "0.001"]) == 1
    err = capsys.readouterr().err
    assert "nothing could be measured" in err and "--max-loop-seconds" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--hidden", "768", "--heads", "5"],
            "--hidden 768 is not a positive multiple of --heads 5",
        ),
        (["--hidden", "8", "--systems", "flash"], "unknown system 'flash'"),
        (["--hidden", "8", "--batch", "0"], "--batch must be at least 1"),
        (["--hidden", "8", "--cell", "nope"], "has no cell named 'nope'"),
    ],
)
def test_cli_errors_are_one_clear_line(args, message, capsys):
    assert main(["bench", str(EXAMPLES / "lstm.rnn"), *args]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-5", "soon"])
def test_cli_refuses_a_loop_limit_that_is_not_a_positive_time(value, capsys):
    argv = ["bench", str(EXAMPLES / "lstm.rnn"), "--hidden", "8", f"--max-loop-seconds={value}"]
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.splitlines()[-1] == (
        "rnncc bench: error: argument --max-loop-seconds: "
        f"must be a positive number of seconds, got {value!r}"
    )


def test_cli_prints_dsl_errors_like_check(tmp_path, capsys):
    bad = tmp_path / "bad.rnn"
    bad.write_text("cell x(h) {\n    gates a = W x + R h\n    h = sigmod(a)\n}\n")
    assert main(["bench", str(bad), "--hidden", "8"]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:3:9: error: unknown function 'sigmod'" in err and "^~~~~~" in err


# ---- the suite's plan --------------------------------------------------------------------


def test_suite_plan_covers_the_protocol_once():
    suite = _script("run_suite")
    items = suite.plan(batch_cells=("lstm",))
    keys = list(items)
    assert len(keys) == len(set(keys))
    step = [c for s, c in keys if s == "rnncc-stepwise"]
    headdim = {(c.D, c.NH) for s, c in keys if "headdim" in items[(s, c)]}
    assert headdim >= set(suite.HEAD_DIMS)
    assert {(c.cell, c.B) for c in step if c.T == 1024 and c.NH == 12} >= {
        ("lstm", B) for B in suite.BATCHES
    }
    assert not any(c.cell == "gru" and c.B == 256 for c in step)  # batch sweep: LSTM only
    assert {c.T for c in step if c.B == 16} == set(suite.SEQS)
    cudnn = [c for s, c in keys if s == "cudnn"]
    assert all(c.NH == 1 for c in cudnn) and not any(c.cell == "slstm" for c in cudnn)
    anchors = {(s, c.cell, c.dtype, c.B, c.D) for (s, c), sw in items.items() if "anchor" in sw}
    assert {("cudnn", "lstm", d, 16, 768) for d in ("fp16", "bf16", "fp32")} <= anchors
    assert {("cudnn", "lstm", "fp16", 16, 256), ("cudnn", "lstm", "fp16", 64, 768)} <= anchors
    loops = [c for s, c in keys if s == "torch-loop"]
    assert {(c.B, c.T, c.NH, c.D, c.dtype) for c in loops} == {(16, 1024, 1, 768, "bf16")}

    def loop(cell):
        return "torch-loop", Case(cell, 16, 1024, 1, 768, "bf16")

    assert items[loop("lstm")] == ["anchor", "headdim", "seq", "batch"]
    assert items[loop("gru")] == ["anchor", "headdim", "seq"]
    assert keys[0][0] == "cudnn" and items[keys[-1]] == ["batch"]  # anchors first, batch last


def test_suite_measures_in_order_saves_each_time_and_honours_budget_and_resume(capsys):
    import rnncc

    suite = _script("run_suite")
    cells = {"lstm": rnncc.load(EXAMPLES / "lstm.rnn")}
    tiny = Case("lstm", 2, 3, 1, 4, "fp32")
    items = {("torch-loop", tiny): ["anchor"], ("rnncc-stepwise", tiny): ["headdim", "seq"]}
    saved: list[int] = []
    settings = Settings(warmup=0, repeats=1, loop_warmup=0, loop_repeats=1)
    records = suite.measure_all(
        items, cells, device="cpu", settings=settings, save=lambda rs: saved.append(len(rs))
    )
    assert saved == [1, 2]
    assert [(r.system, r.status, r.sweeps) for r in records] == [
        ("torch-loop", "ok", ["anchor"]),
        ("rnncc-stepwise", "unavailable", ["headdim", "seq"]),
    ]
    assert "torch-loop" in capsys.readouterr().out
    kept = {suite._key("torch-loop", tiny): records[0]}
    again = suite.measure_all(items, cells, device="cpu", settings=settings, deadline=0, kept=kept)
    assert again[0].fw_ms == records[0].fw_ms  # reused, not measured again
    assert again[1].status == "skipped" and "--budget-s" in again[1].note


# ---- the report --------------------------------------------------------------------------


def _results(path: Path) -> Path:
    def rec(system, cell, dtype, NH, D, fw, fwbw, sweeps, **kw):
        return {
            **Record(system, cell, dtype, 16, 1024, NH, D, fw, fwbw, sweeps=sweeps).as_dict(),
            **kw,
        }

    records = [
        rec("cudnn", "lstm", "fp16", 1, 768, 2.5, 7.5, ["anchor", "headdim"]),
        rec("cudnn", "lstm", "bf16", 1, 768, 20.0, 40.0, ["anchor", "headdim"]),
        rec("rnncc-stepwise", "lstm", "bf16", 12, 64, 10.0, 30.0, ["headdim"]),
        rec("rnncc-stepwise", "lstm", "bf16", 1, 768, 12.5, 37.5, ["headdim"]),
        rec("rnncc-stepwise", "slstm", "bf16", 12, 64, 5.0, 15.0, ["headdim"]),
        rec("torch-loop", "lstm", "bf16", 1, 768, 164.0, 632.0, ["anchor", "headdim"]),
        rec(
            "rnncc-fused",
            "lstm",
            "bf16",
            12,
            64,
            None,
            None,
            ["headdim"],
            status="unavailable",
            note="no fused kernel",
        ),
    ]
    machine = {
        "gpu": "NVIDIA H100 80GB HBM3",
        "driver": "580",
        "torch": "2.11",
        "cuda": "13.0",
        "date": "2026-01-02",
    }
    path.write_text(json.dumps({"machine": machine, "records": records}))
    return path


def test_report_markdown_ratios_and_anchors(report, tmp_path):
    data = json.loads(_results(tmp_path / "h100-2026-01-02.json").read_text())
    md = report.markdown(data, "h100-2026-01-02.json")
    assert (
        "| cell | NH × D | rnncc-stepwise | cuDNN fp16 (1 head) | cuDNN bf16 (1 head) | torch-loop |"
        in md
    )
    assert "| lstm | 12 × 64 | 10.0 / 30.0 (4.0× / 4.0×) | 2.50 / 7.50 | 20.0 / 40.0 | — |" in md
    assert (
        "| lstm | 1 × 768 | 12.5 / 37.5 (5.0× / 5.0×) | 2.50 / 7.50 | 20.0 / 40.0 | 164 / 632 |"
        in md
    )
    assert "| slstm | 12 × 64 | 5.00 / 15.0 (2.0× / 2.0×†) | — | — | — |" in md
    assert "| cudnn | lstm | fp16 | 16 | 1 × 768 | 2.50 | 7.50 | 2.47 / 7.48 | 1.0× / 1.0× |" in md
    assert "- rnncc-fused: unavailable ×1: no fused kernel" in md


def test_report_readme_block_replaced_or_explained(report, tmp_path, capsys, monkeypatch):
    (tmp_path / "results").mkdir()
    src = _results(tmp_path / "results" / "h100-2026-01-02.json")
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\n<!-- bench-table -->\nold table\n<!-- /bench-table -->\n\ntail\n")
    assert report.main([str(src), "--readme", str(readme), "--no-plots"]) == 0
    text = readme.read_text()
    assert "old table" not in text and text.endswith("<!-- /bench-table -->\n\ntail\n")
    assert "[h100-2026-01-02.md](results/h100-2026-01-02.md)" in text
    assert "| lstm | 12 × 64 | 10.0 / 30.0 (4.0× / 4.0×)" in text
    assert (tmp_path / "results" / "h100-2026-01-02.md").is_file()

    plain = tmp_path / "PLAIN.md"
    plain.write_text("# no markers\n")
    capsys.readouterr()
    assert report.main([str(src), "--readme", str(plain), "--no-plots"]) == 0
    assert plain.read_text() == "# no markers\n"
    err = capsys.readouterr().err
    assert "<!-- bench-table -->\nNVIDIA H100" in err and err.rstrip().endswith(
        "<!-- /bench-table -->"
    )

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as on the GPU machine
    assert report.plot(json.loads(src.read_text()), tmp_path / "x") == []
    assert "matplotlib is not installed" in capsys.readouterr().err
    assert report.main([str(tmp_path / "README.md")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_report_plots_when_matplotlib_is_installed(report, tmp_path):
    pytest.importorskip("matplotlib")
    src = _results(tmp_path / "h100.json")
    written = report.plot(json.loads(src.read_text()), tmp_path / "h100")
    assert [p.name for p in written] == ["h100-headdim.png"]  # the only sweep with data
    assert written[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_step_phases_names_each_phase_a_template_marks():
    """``benchmarks/step_phases.py`` prints a name for each phase between a kernel's clock marks
    (``RNNCC_TRACE(i)``, i = 0 .. n): as many names as the template has phases."""
    import re

    from rnncc.resources import templates_dir

    phases = _script("step_phases")
    for variant, names in phases.PHASES.items():
        template = "grid_mma.cuh" if variant == "grid_stream" else f"{variant}.cuh"
        text = (templates_dir() / template).read_text()
        for kind in ("fw", "bw"):
            end = text.index(f'RNNCC_TRACE_PRINT("{kind}"')
            start = text.rindex("RNNCC_TRACE_INIT", 0, end)
            marks = {int(i) for i in re.findall(r"RNNCC_TRACE\((\d+)\)", text[start:end])}
            assert marks == set(range(len(names[kind]) + 1)), (variant, kind, sorted(marks))


def test_sparse_banks_counts_wavefronts_of_the_gathers_order():
    """``benchmarks/sparse_banks.py``: 32 columns with two of each bank group read in 2
    wavefronts, 32 of one group in 32; the floor of a random strip is at most its count."""
    import numpy as np

    banks = _script("sparse_banks")
    spread = np.zeros((1, 1024), dtype=bool)
    spread[0, :32] = True  # columns 0..31: each group twice
    one_group = np.zeros((1, 1024), dtype=bool)
    one_group[0, ::32] = True  # columns 0, 32, ..., 992: all in group 0
    for mask, want in ((spread, 2), (one_group, 32)):
        columns, start = banks.gather_order(mask)
        assert sorted(columns) == list(np.nonzero(mask[0])[0]) and start == [0, 32]
        assert banks.product_steps(columns, start, warps=1) == [want]
    mask = np.random.default_rng(0).random((72, 2304)) < 0.3
    steps = banks.product_steps(*banks.gather_order(mask))
    assert 2 <= banks.floor(mask) <= sum(steps) / len(steps) < 3


def test_ab_speed_compares_the_fastest_runs_of_lists_and_results_files(tmp_path, capsys):
    """``benchmarks/ab_speed.py --compare`` takes each tree's fastest run of a problem, reads a
    run's list of records and a committed results file's ``records`` alike, and fails (1) where
    B is more than the tolerance slower."""
    ab = _script("ab_speed")

    def rec(system: str, fw: float, fwbw: float) -> dict:
        return {"system": system, "cell": "lstm", "NH": 12, "D": 64, "B": 16, "T": 1024} | {
            "dtype": "bf16",
            "status": "ok",
            "fw_ms": fw,
            "fwbw_ms": fwbw,
        }

    a1, a2, b = tmp_path / "a1.json", tmp_path / "a2.json", tmp_path / "b.json"
    a1.write_text(json.dumps([rec("A", 1.0, 3.0)]))
    a2.write_text(json.dumps({"machine": {}, "records": [rec("A", 0.9, 3.2)]}))
    b.write_text(json.dumps([rec("B", 0.92, 3.05)]))
    assert ab.compare(f"{a1},{a2}", str(b), 0.03) == 0
    assert "lstm 12x64 B16" in capsys.readouterr().out
    assert ab.compare(f"{a1},{a2}", str(b), 0.01) == 1  # fw 0.92 against the fastest A, 0.9
