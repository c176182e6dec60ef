"""Foreseeable mistakes get one clear line on stderr and a documented exit code, never a traceback.

The cases of issue 16 that need no broker: ``simulate --plot`` into a missing folder or without
matplotlib, ``status --interval-s -1``, an unusable ``kafka --state-dir``, ``kafka start --port
99999``, ``collect`` and ``collector`` asked for Parquet without pyarrow. Each runs in-process, so
an exception that escaped would fail the test itself; the cases needing a broker (missing topics, a
``--group`` that does not match) are in tests/broker/test_foreseeable_errors.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from processor.sim.tracegen import synthetic_records, write_jsonl
from tests.cli.helpers import run_cli


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return write_jsonl(
        synthetic_records(50, seed=3, shapes=2, min_len=16, max_len=500, rate_per_s=100), tmp_path / "t.jsonl"
    )


@pytest.fixture
def no_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.setenv("TOKENFABRIC_HOME", str(tmp_path / "home"))


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err, err
    return lines[0]


def test_simulate_plot_into_a_missing_folder(
    capsys: pytest.CaptureFixture[str], trace: Path, tmp_path: Path
) -> None:
    target = tmp_path / "no" / "such" / "chart.png"
    code, out, err = run_cli(capsys, "simulate", "--trace", str(trace), "--plot", str(target))
    assert code == 2
    assert one_line(err) == (
        f"tokenfabric simulate: error: --plot {target}: there is no folder {target.parent} "
        "(create it, or plot elsewhere)"
    )
    assert out == "", "the simulation ran before the plot's folder was checked"


def test_plot_without_matplotlib(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, trace: Path, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails, as uninstalled
    code, out, err = run_cli(capsys, "simulate", "--trace", str(trace), "--plot", str(tmp_path / "c.png"))
    assert code == 2
    assert "--plot needs matplotlib: pip install 'tokenfabric[plot]'" in one_line(err)
    assert out == "" and not (tmp_path / "c.png").exists()


def test_status_with_a_negative_interval(capsys: pytest.CaptureFixture[str], no_cluster: None) -> None:
    code, _, err = run_cli(capsys, "status", "--watch", "--interval-s", "-1")
    assert code == 2
    assert one_line(err) == "tokenfabric status: error: --interval-s must be > 0, got -1"


@pytest.mark.parametrize("action", ["start", "stop", "status", "restart"])
def test_kafka_state_dir_under_a_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, action: str
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, _, err = run_cli(capsys, "kafka", "--state-dir", str(blocker / "kafka"), action)
    assert code == 1
    assert (
        one_line(err) == f"tokenfabric kafka: error: --state-dir {blocker / 'kafka'}: {blocker}: not a folder"
    )


def test_kafka_state_dir_that_cannot_be_created(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Root ignores file modes, so the refusal is made the way a read-only file system makes it."""

    def refuse(self: Path, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "mkdir", refuse)
    state = tmp_path / "ro" / "kafka"
    code, _, err = run_cli(capsys, "kafka", "--state-dir", str(state), "start")
    assert code == 1
    assert one_line(err) == f"tokenfabric kafka: error: --state-dir {state}: {state}: Permission denied"


@pytest.mark.parametrize(
    ("port", "why"), [("99999", "99999 is not a port (1-65535)"), ("x", "'x' is not a port")]
)
def test_kafka_start_with_a_bad_port(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, port: str, why: str
) -> None:
    code, _, err = run_cli(capsys, "kafka", "--state-dir", str(tmp_path / "k"), "start", "--port", port)
    assert code == 2
    line = one_line(err)
    assert line.startswith(f"tokenfabric kafka start: error: argument --port: {why}"), line
    assert not (tmp_path / "k").exists(), "the port was checked after the state dir was made"


@pytest.mark.parametrize(
    "argv",
    [
        ["collect", "--job", "j", "--out", "{tmp}/r.parquet"],
        ["collector", "--out-dir", "{tmp}/out", "--format", "parquet"],
    ],
    ids=["collect", "collector"],
)
def test_parquet_without_pyarrow(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    no_cluster: None,
    tmp_path: Path,
    argv: list[str],
) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    code, _, err = run_cli(capsys, *(a.replace("{tmp}", str(tmp_path)) for a in argv))
    assert code == 2
    assert (
        one_line(err)
        == f"tokenfabric {argv[0]}: error: Parquet needs pyarrow: pip install 'tokenfabric[jobs]'"
    )


@pytest.mark.parametrize("value", ["0", "-2", "three", "2.5"])
def test_submit_with_a_bad_max_attempts(
    capsys: pytest.CaptureFixture[str], no_cluster: None, value: str
) -> None:
    code, out, err = run_cli(capsys, "submit", "rows.jsonl", "--job", "j", "--max-attempts", value)
    assert code == 2 and out == ""
    assert one_line(err) == (
        "tokenfabric submit: error: --max-attempts must be a whole number >= 1 (1: never retry a "
        f"failed item), got {value!r}"
    )
