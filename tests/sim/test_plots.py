"""Charts: `simulate --plot` (every policy, simulated) and the demo's (two measured runs) are PNGs."""

from __future__ import annotations

from pathlib import Path

from processor.cli.tokenfabric import main
from processor.local.pipeline import DEFAULT_CARDS
from processor.sim.traces import read_shipped, shipped_trace

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_simulate_plot_writes_a_png(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "chart.png"
    trace = shipped_trace("mooncake_synthetic")
    code = main(
        [
            "simulate",
            "--trace",
            str(trace),
            "--format",
            "mooncake",
            "--limit",
            "300",
            "--backlog",
            "--policy",
            "all",
            "--plot",
            str(out),
        ]
    )
    assert code == 0
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert out.stat().st_size > 10_000  # four panels, not an empty canvas
    assert "padding waste" in capsys.readouterr().out


def test_the_simulated_chart_names_its_trace(tmp_path: Path) -> None:
    from processor.sim.plots import plot_simulation
    from processor.sim.simulator import POLICIES, parse_consumer_spec, simulate

    specs = [parse_consumer_spec(c.spec("default")) for c in DEFAULT_CARDS]
    reports = [simulate(read_shipped("azure_code", limit=200), specs, p, backlog=True) for p in POLICIES]
    out = tmp_path / "sim.png"
    plot_simulation(reports, str(out), "azure_code")
    assert out.read_bytes()[:8] == PNG_MAGIC


def test_the_demo_chart_shows_the_two_measured_runs(tmp_path: Path) -> None:
    from processor.sim.plots import plot_measured

    run = {"items": 10, "engine": "sim", "real_tokens_per_s": 100.0, "makespan_s": 2.0,
           "padding_waste": 0.0, "budget_fill": 0.1, "shape_switches": 3, "cache_hit_rate": 0.9}  # fmt: skip
    out = tmp_path / "demo.png"
    plot_measured({"tokenfabric": run, "plain-queue": {**run, "padding_waste": 0.5}}, str(out), "t: measured")
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert out.stat().st_size > 10_000
