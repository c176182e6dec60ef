"""``tokenfabric simulate`` from the command line: output formats and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from processor.sim.tracegen import synthetic_records, write_jsonl
from tests.cli.helpers import run_cli as cli
from tests.common import ROOT as REPO

JSON_KEYS = {
    "items", "batches", "tokens_received", "tokens_routed", "padded_tokens", "padding_waste", "budget_fill",
    "mixed_shape_batches", "shape_switches", "cache_hit_rate", "lanes_in_use_peak", "lane_pressure_peak",
    "lane_reuses", "new_lanes", "wait_ms", "makespan_ms", "tokens_per_s", "oversized",
}  # fmt: skip


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    records = synthetic_records(400, seed=11, shapes=4, min_len=16, max_len=6000, rate_per_s=100)
    return write_jsonl(records, tmp_path_factory.mktemp("trace") / "trace.jsonl")


def simulate_json(capsys: pytest.CaptureFixture[str], trace: Path, *extra: str) -> dict:
    code, out, err = cli(capsys, "simulate", "--trace", str(trace), "--json", *extra)
    assert (code, err) == (0, "")
    return json.loads(out)


# ------------------------------------------------------------------------------ output


def test_table_output(capsys: pytest.CaptureFixture[str], trace: Path) -> None:
    code, out, err = cli(capsys, "simulate", "--trace", str(trace))
    assert (code, err) == (0, "")
    header, *rows = out.splitlines()
    assert header.split() == ["lanes"]
    names = [row.split("  ")[0] for row in rows]
    assert {"items", "padding waste", "mixed-shape batches", "wait p50 / p99 / max ms"} <= set(names)
    assert rows[0].split()[-1] == "400"


def test_table_output_for_several_policies(capsys: pytest.CaptureFixture[str], trace: Path) -> None:
    code, out, _err = cli(capsys, "simulate", "--trace", str(trace), "--policy", "lanes, fifo", "--backlog")
    assert code == 0
    assert out.splitlines()[0].split() == ["lanes", "fifo"]


def test_json_output_has_every_figure(capsys: pytest.CaptureFixture[str], trace: Path) -> None:
    report = simulate_json(capsys, trace)
    assert set(report) >= JSON_KEYS
    assert set(report["wait_ms"]) == {"p50", "p99", "max"}
    assert report["items"] == 400
    assert report["tokens_received"] == report["tokens_routed"]
    assert report["mixed_shape_batches"] == 0
    assert set(report["consumers"]) == {"card16", "card32"}


def test_json_for_all_policies_is_keyed_by_policy(capsys: pytest.CaptureFixture[str], trace: Path) -> None:
    reports = simulate_json(capsys, trace, "--policy", "all", "--backlog")
    assert list(reports) == ["lanes", "fifo", "sorted-window", "oracle"]
    assert all(set(r) >= JSON_KEYS for r in reports.values())


def test_options_reach_the_simulation(capsys: pytest.CaptureFixture[str], trace: Path) -> None:
    report = simulate_json(
        capsys,
        trace,
        "--limit",
        "50",
        "--consumer",
        "solo:budget=4096,items=8,inflight=1",
        "--lane-budget",
        "2",
    )
    assert report["items"] == 50
    assert set(report["consumers"]) == {"solo"}
    assert report["lanes_in_use_peak"] <= 2 * 4  # 2 lanes per shape, 4 shapes


def test_emit_batches_writes_one_line_per_batch(
    capsys: pytest.CaptureFixture[str], trace: Path, tmp_path: Path
) -> None:
    out_file = tmp_path / "batches.jsonl"
    report = simulate_json(capsys, trace, "--emit-batches", str(out_file))
    lines = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert len(lines) == report["batches"]
    assert sum(b["padded_length"] * len(b["items"]) for b in lines) == report["padded_tokens"]


def test_shipped_trace_in_another_format(capsys: pytest.CaptureFixture[str]) -> None:
    azure = REPO / "data" / "traces" / "AzureLLMInferenceTrace_code.csv.gz"
    report = simulate_json(capsys, azure, "--format", "azure", "--limit", "300", "--backlog")
    assert report["items"] == 300


def test_the_module_entry_point_runs_as_a_program(trace: Path) -> None:
    argv = [
        sys.executable,
        "-m",
        "processor",
        "simulate",
        "--trace",
        str(trace),
        "--json",
        "--limit",
        "100",
    ]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert (proc.returncode, proc.stderr) == (0, "")
    assert json.loads(proc.stdout)["items"] == 100


# ------------------------------------------------------------------------------ errors


def write(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


GOOD_LINE = '{"t_ms": 0, "model": "default", "shape": 1, "length": 100}'


def assert_one_line_error(code: int, out: str, err: str, *needles: str) -> None:
    assert code == 2
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("tokenfabric")
    for needle in needles:
        assert needle in err, err


def test_missing_trace_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    assert_one_line_error(*cli(capsys, "simulate", "--trace", str(missing)), f"{missing}: no such file")


def test_malformed_jsonl_line_names_file_and_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = write(tmp_path / "bad.jsonl", GOOD_LINE, GOOD_LINE, '{"t_ms": 5, "model": ')
    assert_one_line_error(*cli(capsys, "simulate", "--trace", str(bad)), f"{bad}:3:", "malformed JSON")


def test_negative_length_names_file_and_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = write(
        tmp_path / "neg.jsonl", GOOD_LINE, '{"t_ms": 1, "model": "default", "shape": 1, "length": -5}'
    )
    assert_one_line_error(*cli(capsys, "simulate", "--trace", str(bad)), f"{bad}:2:", '"length"', "-5")


def test_unknown_format_names_the_option(capsys: pytest.CaptureFixture[str], trace: Path) -> None:
    assert_one_line_error(
        *cli(capsys, "simulate", "--trace", str(trace), "--format", "xml"), "--format", "xml"
    )


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("no-colon", "expected NAME:key=value"),
        ("c:budget=lots", "is not a number"),
        ("c:warp=9", "unknown key"),
    ],
)
def test_bad_consumer_spec_names_the_option(
    capsys: pytest.CaptureFixture[str], trace: Path, spec: str, needle: str
) -> None:
    result = cli(capsys, "simulate", "--trace", str(trace), "--consumer", spec)
    assert_one_line_error(*result, "--consumer", spec, needle)


@pytest.mark.parametrize("policy", ["round-robin", "lanes,magic", ","])
def test_bad_policy_names_the_option(capsys: pytest.CaptureFixture[str], trace: Path, policy: str) -> None:
    assert_one_line_error(*cli(capsys, "simulate", "--trace", str(trace), "--policy", policy), "--policy")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--limit", "0"], "--limit"),
        (["--speed", "0"], "--speed"),
        (["--limit", "many"], "--limit"),
        (["--lane-budget", "0"], "lane_budget"),
        (["--emit-batches", "x.jsonl", "--policy", "all"], "--emit-batches"),
    ],
)
def test_other_bad_options_fail_in_one_line(
    capsys: pytest.CaptureFixture[str], trace: Path, args: list[str], needle: str
) -> None:
    assert_one_line_error(*cli(capsys, "simulate", "--trace", str(trace), *args), needle)


def test_missing_required_trace_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert_one_line_error(*cli(capsys, "simulate"), "--trace")


AZURE_CONV = REPO / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv.gz"


def test_simulate_compares_every_mode_in_one_table(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--trace", str(AZURE_CONV), "--format", "azure", "--limit", "300", "--backlog"]
    code, out, err = cli(
        capsys, *argv, "--batching", "all", "--memory-bytes", "2147483648", "--kv-bytes-per-token", "131072"
    )
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["lanes/rows", "lanes/tokens", "lanes/memory"]
    peak = next(line for line in lines if line.startswith("KV bytes peak / memory_bytes"))
    assert peak.split()[-1].endswith("%") and float(peak.split()[-1][:-1]) <= 100.0
    assert any(line.startswith("padding waste") for line in lines)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--batching", "memory"], "--batching memory needs --memory-bytes and --kv-bytes-per-token"),
        (["--batching", "memory", "--memory-bytes", "100"], "needs --kv-bytes-per-token"),
        (["--batching", "pages"], "--batching 'pages': choose from rows, tokens, memory or 'all'"),
        (["--batching", "all", "--plot", "x.png"], "--plot compares policies"),
        (["--consumer", "c:batching=memory"], "memory_bytes must be >= 1 in memory batching"),
        (["--consumer", "c:memory_bytes=lots"], "memory_bytes='lots' is not a number"),
    ],
)
def test_simulate_batching_errors_are_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    code, out, err = cli(
        capsys, "simulate", "--trace", str(AZURE_CONV), "--format", "azure", "--limit", "5", *argv
    )
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and needle in err, err


# ------------------------------------------------------------------------------ jobs (docs/shares.md)


@pytest.fixture(scope="module")
def jobs_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from msgspec.structs import replace

    big = synthetic_records(600, seed=3, shapes=4, min_len=16, max_len=2000, rate_per_s=None)
    small = synthetic_records(60, seed=4, shapes=2, min_len=16, max_len=2000, rate_per_s=None)
    records = [replace(r, job="big") for r in big] + [
        replace(r, job="small", id=f"s{r.id}", t_ms=2000) for r in small
    ]
    return write_jsonl(records, tmp_path_factory.mktemp("jobs") / "jobs.jsonl")


def test_job_weights_reach_the_report(capsys: pytest.CaptureFixture[str], jobs_trace: Path) -> None:
    report = simulate_json(capsys, jobs_trace, "--job-weight", "small=4", "--job-rate", "big=1e9")
    jobs = report["jobs"]
    assert set(jobs) == {"big", "small"}
    assert (jobs["small"]["weight"], jobs["big"]["weight"]) == (4.0, 1.0)
    assert jobs["small"]["items"] == 60
    assert sum(j["real_tokens"] for j in jobs.values()) == report["tokens_routed"]
    code, out, _err = cli(capsys, "simulate", "--trace", str(jobs_trace), "--job-weight", "small=4")
    assert code == 0
    assert "job small: first / done s" in out


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--job-weight", "small", "--job-weight 'small': expected JOB=NUMBER"),
        ("--job-weight", "small=x", "--job-weight 'small=x': 'x' is not a number"),
        ("--job-weight", "small=0", "job 'small': weight must be > 0, got 0.0"),
    ],
)
def test_bad_job_flags_are_one_line_errors(
    capsys: pytest.CaptureFixture[str], jobs_trace: Path, flag: str, value: str, message: str
) -> None:
    code, out, err = cli(capsys, "simulate", "--trace", str(jobs_trace), flag, value)
    assert (code, out) == (2, "")
    assert err.strip() == f"tokenfabric simulate: error: {message}"
